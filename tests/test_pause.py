"""Pause and resume a queue (issue #15 item 3): lua/pause.lua, lua/resume.lua and
claim.lua's refusal, through the API, the asyncio API, the CLI, the TOML and a real
supervisor."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis as redis_lib

from forq import AsyncQueue, Queue
from forq.supervisor.config.load import ConfigError, load_config
from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for, wait_job
from tests.supervisors import REPO, SupervisorProcess, write_config

OWNER = "pause-test:1"
TERMINAL = ("succeeded", "dead", "cancelled")
LONG = 60_000


def redis_ms(client: redis_lib.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


# -- the scripts ------------------------------------------------------------------------


def test_a_paused_queue_leases_nothing_and_promotes_nothing(queue: Queue):
    queue.enqueue("t.a")
    queue.enqueue("t.later", delay=0.05)
    wait_for(lambda: redis_ms(queue.redis) > int(queue.redis.zrange(
        queue.keys.scheduled, 0, 0, withscores=True)[0][1]), message="the delayed job due")
    assert queue.pause() is True
    assert queue.pause() is False  # already paused: unchanged
    assert queue.is_paused() and queue.stats()["paused"] is True

    claim = leasing(queue).claim(OWNER, 10, LONG)
    assert claim.leases == [] and claim.pending_left == 1
    assert claim.next_due_ms == -1  # no timer armed for a queue that leases nothing
    assert queue.redis.zcard(queue.keys.scheduled) == 1  # due, but not promoted

    assert queue.resume() is True
    assert queue.resume() is False
    assert not queue.is_paused() and queue.stats()["paused"] is False
    claim = leasing(queue).claim(OWNER, 10, LONG)
    assert sorted(lease.job.task for lease in claim.leases) == ["t.a", "t.later"]


def test_pause_keeps_running_leases(queue: Queue):
    queue.enqueue("t.a")
    (lease,) = leasing(queue).claim(OWNER, 1, LONG).leases
    queue.pause()
    assert leasing(queue).extend([(lease.id, lease.token)], LONG).lost == []
    assert leasing(queue).ack(lease.id, lease.token, '"done"') == "ok"
    assert queue.get(lease.id).state == "succeeded"


def test_resume_publishes_a_wake_and_pause_does_not(queue: Queue, r: redis_lib.Redis):
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(queue.keys.wake)
    try:
        wait_for(lambda: r.pubsub_numsub(queue.keys.wake)[0][1] >= 1, message="subscribed")
        queue.pause()
        queue.resume()
        queue.resume()  # not paused: no second wake
        queue.pause()
        queue.resume()
        got = []
        wait_for(lambda: got.extend(m["data"] for m in iter(
            lambda: pubsub.get_message(timeout=0.01), None)) or len(got) >= 2,
            message="two wake messages")
        pubsub.get_message(timeout=0.2)  # nothing more arrives
        assert got == ["0", "0"]
    finally:
        pubsub.close()


def test_async_queue_pauses_with_the_same_scripts(redis_url: str, queue: Queue):
    async def scenario() -> tuple[bool, bool, bool, bool, bool]:
        async with AsyncQueue(queue.name, url=redis_url) as aq:
            paused = await aq.pause()
            again = await aq.pause()
            seen = await aq.is_paused()
            stats = (await aq.stats())["paused"]
            resumed = await aq.resume()
            return paused, again, seen, stats, resumed

    assert asyncio.run(scenario()) == (True, False, True, True, True)
    assert not queue.is_paused()


# -- the CLI ----------------------------------------------------------------------------


def forq(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url,
                           *args], capture_output=True, text=True, timeout=30, cwd=REPO)


def test_cli_pause_resume_and_stats(redis_url: str, queue: Queue):
    queue.enqueue("t.a")
    done = forq(redis_url, "pause", queue.name)
    assert done.returncode == 0 and f"paused queue {queue.name}" in done.stdout, done.stderr
    assert json.loads(forq(redis_url, "pause", queue.name, "--json").stdout) == {
        "queue": queue.name, "paused": True, "changed": False}
    stats = json.loads(forq(redis_url, "stats", "-q", queue.name, "--json").stdout)
    assert stats[queue.name]["paused"] is True
    table = forq(redis_url, "stats", "-q", queue.name).stdout
    assert f"{queue.name} (paused)" in table
    done = forq(redis_url, "resume", queue.name, "--json")
    assert json.loads(done.stdout) == {"queue": queue.name, "paused": False, "changed": True}
    assert "was not paused" in forq(redis_url, "resume", queue.name).stdout
    assert "(paused)" not in forq(redis_url, "stats", "-q", queue.name).stdout


@pytest.mark.parametrize("argv, needle", [(["pause", "no:colons"], "no:colons"),
                                          (["resume"], "queue")])
def test_cli_bad_queue_is_one_line(redis_url: str, argv: list[str], needle: str):
    done = forq(redis_url, *argv)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and needle in done.stderr


# -- the TOML ---------------------------------------------------------------------------


def test_config_paused_must_be_a_boolean(tmp_path: Path):
    path = tmp_path / "forq.toml"
    path.write_text('[[queue]]\nname = "q"\nconcurrency = 1\npaused = "yes"\n')
    with pytest.raises(ConfigError, match=r"\[queue 1\]\.paused.*true or false"):
        load_config(path, env={})
    path.write_text('[[queue]]\nname = "q"\nconcurrency = 1\npaused = true\n')
    assert load_config(path, env={}).queues[0].paused is True


# -- a real supervisor ------------------------------------------------------------------


def test_supervisor_pause_stops_claims_running_job_keeps_its_lease_resume_wakes(
        tmp_path: Path, redis_url: str, queue: Queue):
    gate = tmp_path / "gate"
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2},
                          lease_ttl="1s", drain_timeout="1s")
    with SupervisorProcess(config).start() as sup:
        running = queue.enqueue("tests.wait_file", str(gate))
        first = wait_job(queue, running.id, ("active",), context=lambda: sup.log()[-3000:])
        assert queue.pause()
        waiting = queue.enqueue("tests.echo", "after pause")  # its wake reaches the supervisor

        # the supervisor keeps turning (it extends the running lease, same token, several
        # times): it was woken by the enqueue and had a free slot, yet claims nothing
        deadlines = [int(first.fields["lease_deadline"])]

        def extended() -> bool:
            job = queue.get(running.id)
            assert job.state == "active" and job.fields["token"] == first.fields["token"]
            deadline = int(job.fields["lease_deadline"])
            if deadline > deadlines[-1]:
                deadlines.append(deadline)
            return len(deadlines) >= 4

        wait_for(extended, timeout=15, message="three lease extensions while paused")
        assert queue.get(waiting.id).state == "pending"

        gate.touch()  # the running job finishes normally: its ack lands (lease kept)
        assert wait_job(queue, running.id, TERMINAL).state == "succeeded"
        assert queue.get(waiting.id).state == "pending"  # the freed slot stays empty

        resumed_at = redis_ms(queue.redis)
        assert queue.resume()
        done = wait_job(queue, waiting.id, TERMINAL, timeout=10, context=lambda: sup.log()[-3000:])
        assert done.state == "succeeded"
        # woken by resume's publish, not found by the 2 s safety-net poll
        started_after = int(done.fields["started_at"]) - resumed_at
        assert 0 <= started_after < 1500, f"claimed {started_after} ms after resume"


def test_supervisor_config_paused_pauses_at_start(tmp_path: Path, redis_url: str,
                                                  queue: Queue):
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1},
                          queue_extra="paused = true\n")
    job = queue.enqueue("tests.echo", "x")
    with SupervisorProcess(config).start() as sup:
        wait_for(lambda: "paused by the config" in sup.log(), message="the pause logged")
        assert queue.is_paused() and queue.get(job.id).state == "pending"
        queue.resume()
        assert wait_job(queue, job.id, TERMINAL, context=lambda: sup.log()[-3000:]).state == "succeeded"
