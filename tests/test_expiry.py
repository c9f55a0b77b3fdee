"""Expiry before start (issue #15 item 4): `expires_in` / `expire_at` on enqueue. A job
not started by then never runs: claim.lua moves it to dead ("expired before start")
when it reaches it, and the reaper's sweep (sweep_expired.lua) when it waits."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis as redis_lib

from forq import Queue
from forq.errors import PayloadError
from forq.job import Job
from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for, wait_job
from tests.supervisors import REPO, SupervisorProcess, write_config

OWNER = "expiry-test:1"
LONG = 60_000
REASON = "expired before start"


def redis_ms(client: redis_lib.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def past_expiry(queue: Queue, *jobs: Job) -> None:
    """Wait (on Redis's clock, which the scripts use) until every job's expiry passed."""
    deadline = max(int(queue.get(job.id).fields["expire_at"]) for job in jobs)
    wait_for(lambda: redis_ms(queue.redis) > deadline, timeout=10, message="expiry passed")


def assert_expired(queue: Queue, job: Job) -> None:
    record = queue.get(job.id)
    assert record.state == "dead" and record.reason == REASON
    assert record.history[-1]["event"] == "dead" and record.history[-1]["reason"] == REASON
    assert "started_at" not in record.fields  # never ran
    assert queue.redis.zscore(queue.keys.dead, job.id) is not None


# -- bad input --------------------------------------------------------------------------


def _from_now(**seconds: float) -> dict[str, float]:
    """Times as Unix seconds from now (taken when the test runs, not when collected)."""
    return {name: time.time() + offset for name, offset in seconds.items()}


@pytest.mark.parametrize("make, needle", [
    (lambda: {"expires_in": "-5s"}, "expires_in"),
    (lambda: {"expires_in": 0}, "expires_in must be more than 0"),
    (lambda: {"expires_in": "soon"}, "expires_in"),
    (lambda: {"expires_in": True}, "expires_in"),
    (lambda: _from_now(expire_at=-60), "expire_at .* is in the past"),
    (lambda: {"expire_at": "tomorrow"}, "expire_at must be a datetime or Unix seconds"),
    (lambda: {"expires_in": "1m", **_from_now(expire_at=60)}, "not both"),
    (lambda: {"expires_in": "10s", "delay": "1m"}, "ends before the job is due"),
    (lambda: _from_now(expire_at=30, run_at=60), "ends before the job is due"),
])
def test_bad_expiry_is_refused_naming_the_argument(queue: Queue, make, needle):
    options = make()
    with pytest.raises(PayloadError, match=needle):
        queue.enqueue("t.a", **options)
    with pytest.raises(PayloadError, match=r"jobs\[1\]: .*" + needle.split()[0]):
        queue.enqueue_many([{"task": "t.ok"}, {"task": "t.a", **options}])
    assert queue.redis.zcard(queue.keys.pending) == 0  # nothing half-enqueued


def test_expire_at_takes_a_datetime(queue: Queue):
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=10)
    job = queue.enqueue("t.a", expire_at=at)
    assert int(queue.get(job.id).fields["expire_at"]) == int(at.timestamp() * 1000)
    assert queue.redis.zscore(queue.keys.expiring, job.id) == int(at.timestamp() * 1000)


# -- claim --------------------------------------------------------------------------------


def test_claim_moves_an_expired_job_to_dead_and_leases_the_rest(queue: Queue):
    late = queue.enqueue("t.late", expires_in="50ms", priority=5)
    fresh = queue.enqueue("t.fresh", expires_in="10m")
    plain = queue.enqueue("t.plain")
    past_expiry(queue, late)

    claim = leasing(queue).claim(OWNER, 1, LONG)  # reaches the expired job first (priority)
    assert claim.leases == []
    assert claim.rate_wait_ms == 1 and claim.pending_left == 2  # claim again at once
    assert_expired(queue, late)
    assert queue.stats()["totals"]["expired"] == 1

    claim = leasing(queue).claim(OWNER, 5, LONG)
    assert sorted(lease.id for lease in claim.leases) == sorted([fresh.id, plain.id])
    assert claim.rate_wait_ms == 0
    assert queue.redis.zcard(queue.keys.expiring) == 0  # started: out of the index


def test_a_started_job_is_never_expired(queue: Queue):
    job = queue.enqueue("t.a", expires_in="100ms")
    (lease,) = leasing(queue).claim(OWNER, 1, LONG).leases
    past_expiry(queue, job)
    assert leasing(queue).release(lease.id, lease.token, "drain") == "ok"  # back to pending
    assert leasing(queue).sweep_expired(OWNER) == []
    (again,) = leasing(queue).claim(OWNER, 1, LONG).leases  # a second start, past its expiry
    assert again.id == job.id


def test_requeued_expired_job_runs(queue: Queue):
    job = queue.enqueue("t.a", expires_in="30ms")
    past_expiry(queue, job)
    assert leasing(queue).sweep_expired(OWNER) == [job.id]
    assert queue.requeue_dead([job.id]) == (1, [])
    (lease,) = leasing(queue).claim(OWNER, 1, LONG).leases
    assert lease.id == job.id and "expire_at" not in lease.job.fields


# -- the reaper's sweep -------------------------------------------------------------------


def test_sweep_takes_expired_jobs_from_pending_scheduled_and_groups(queue: Queue):
    pending = queue.enqueue("t.p", expires_in="50ms")
    grouped = queue.enqueue("t.g", expires_in="50ms", group="customer-1")
    scheduled = queue.enqueue("t.s", delay="20ms", expires_in="60ms")  # due, never promoted
    keep = queue.enqueue("t.k", expires_in="10m")
    cancelled = queue.enqueue("t.c", expires_in="50ms")
    assert queue.cancel(cancelled.id) == "cancelled"
    assert (queue.stats()["pending"], queue.stats()["scheduled"]) == (3, 1)
    past_expiry(queue, pending, grouped, scheduled)

    swept = leasing(queue).sweep_expired(OWNER)
    assert sorted(swept) == sorted([pending.id, grouped.id, scheduled.id])
    for job in (pending, grouped, scheduled):
        assert_expired(queue, job)
    assert queue.get(cancelled.id).state == "cancelled"  # its stale index entry dropped
    stats = queue.stats()
    assert (stats["pending"], stats["scheduled"], stats["dead"]) == (1, 0, 3)
    assert queue.redis.zrange(queue.keys.expiring, 0, -1) == [keep.id]
    assert leasing(queue).sweep_expired(OWNER) == []
    (lease,) = leasing(queue).claim(OWNER, 5, LONG).leases
    assert lease.id == keep.id


def test_sweep_is_bounded_per_call(queue: Queue):
    jobs = queue.enqueue_many([{"task": "t.a", "expires_in": "30ms"} for _ in range(7)])
    past_expiry(queue, *jobs)
    assert len(leasing(queue).sweep_expired(OWNER, limit=3)) == 3
    assert len(leasing(queue).sweep_expired(OWNER, limit=3)) == 3
    assert len(leasing(queue).sweep_expired(OWNER, limit=3)) == 1
    assert queue.stats()["dead"] == 7


def test_supervisor_reaper_sweeps_a_paused_queue(tmp_path: Path, redis_url: str, queue: Queue):
    """A job waiting in a paused queue (no claim will reach it) dies on time anyway."""
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1},
                          reaper_interval="200ms")
    queue.pause()
    job = queue.enqueue("tests.echo", "x", expires_in="300ms")
    with SupervisorProcess(config).start() as sup:
        wait_job(queue, job.id, ("dead",), context=lambda: sup.log()[-3000:])
        assert_expired(queue, job)
        assert queue.get(job.id).history[-1]["by"]  # the sweeping supervisor's id
        wait_for(lambda: "expired before start" in sup.log(), message="the sweep logged")


# -- the CLI ------------------------------------------------------------------------------


def forq(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url,
                           *args], capture_output=True, text=True, timeout=30, cwd=REPO)


def test_cli_enqueue_expires_in(redis_url: str, queue: Queue):
    done = forq(redis_url, "enqueue", "t.a", "-q", queue.name, "--expires-in", "10m")
    assert done.returncode == 0, done.stderr
    record = queue.get(done.stdout.strip())
    assert int(record.fields["expire_at"]) - int(record.fields["enqueued_at"]) == 600_000
    shown = forq(redis_url, "job", record.id).stdout
    assert re.search(r"^  expires +\S", shown, re.M) and "no longer applies" not in shown
    for bad in ("-5s", "0", "soon"):
        done = forq(redis_url, "enqueue", "t.a", "-q", queue.name, "--expires-in", bad)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "--expires-in" in done.stderr
    done = forq(redis_url, "enqueue", "t.a", "-q", queue.name, "--expires-in", "5s",
                "--delay", "1m")
    assert done.returncode == 2 and "ends before the job is due" in done.stderr
