"""Groups through real `forq run` processes: the TOML limits, crashes, a SIGKILLed
supervisor, cancel and the per-group rate; and the CLI's group options.

Jobs that must stay running block on a gate file (`tests.wait_file`) that the test
creates when it has checked what it wanted, so nothing here depends on timing: "group
b ran alongside" is "all of b finished while a's first job was still blocked".
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from forq import Queue
from forq.job import Job
from forq.supervisor.config.load import ConfigError, load_config
from forq.supervisor.fork.messages import encode
from tests import helpers
from tests.helpers import wait_for
from tests.supervisors import REPO, SupervisorProcess, write_config

TERMINAL = ("succeeded", "dead", "cancelled")


def supervisor(tmp_path: Path, redis_url: str, queue: Queue, concurrency: int = 4,
               queue_extra: str = "group_concurrency = 1\n", name: str = "",
               **options: Any) -> SupervisorProcess:
    options.setdefault("drain_timeout", "1s")
    config = write_config(tmp_path / f"forq{name}.toml", redis_url, {queue.name: concurrency},
                          queue_extra=queue_extra, name=name, **options)
    return SupervisorProcess(config)


def wait_job(queue: Queue, job_id: str, states: tuple[str, ...] = TERMINAL,
             sup: SupervisorProcess | None = None, timeout: float = 30.0) -> Job:
    return helpers.wait_job(
        queue, job_id, states, timeout,
        context=lambda: f"supervisor log:\n{sup.log()[-4000:]}" if sup is not None else "")


def state(queue: Queue, job_id: str) -> str:
    return queue.get(job_id).state


def lease_spans(job: Job) -> list[tuple[float, float]]:
    """(claimed at, left active at) for each run of the job, from its history."""
    spans, start = [], None
    for entry in job.history:
        if entry["event"] == "claimed":
            start = entry["at"]
        elif start is not None and entry["event"] in ("succeeded", "dead", "reclaimed",
                                                      "released", "retry", "cancelled"):
            spans.append((start, entry["at"]))
            start = None
    return spans


def assert_no_slot_left(queue: Queue) -> None:
    r = queue.redis
    assert r.hgetall(queue.keys.groups_running) == {}
    assert int(r.get(queue.keys.groups_pending) or 0) == 0


# -- concurrency ------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_one_job_of_a_group_at_a_time_while_other_groups_run(tmp_path, redis_url, queue):
    gates = [tmp_path / f"gate{i}" for i in range(3)]
    a = [queue.enqueue("tests.wait_file", str(g), group="a").id for g in gates]
    b = [queue.enqueue("tests.echo", i, group="b").id for i in range(3)]
    plain = queue.enqueue("tests.echo", "plain").id
    with supervisor(tmp_path, redis_url, queue) as sup:
        for job_id in (*b, plain):
            assert wait_job(queue, job_id, sup=sup).state == "succeeded"
        # all of b and the ungrouped job ran while a's first job blocked the group
        assert [state(queue, j) for j in a] == ["active", "pending", "pending"]
        assert queue.stats()["pending"] == 2
        for i, gate in enumerate(gates):
            gate.touch()
            assert wait_job(queue, a[i], sup=sup).state == "succeeded"
            if i + 1 < len(a):
                wait_job(queue, a[i + 1], ("active",), sup=sup)
                assert all(state(queue, j) == "pending" for j in a[i + 2:])
    spans = sorted(span for j in a for span in lease_spans(queue.get(j)))
    assert len(spans) == 3
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end, spans  # never two of group a leased at once
    assert_no_slot_left(queue)
    assert "Traceback" not in sup.log()


@pytest.mark.timeout(90)
def test_crashed_child_does_not_leak_its_groups_slot(tmp_path, redis_url, queue):
    # crash 1: reclaimed back to its group; crash 2: dead. Either way the slot is freed,
    # so the group's next job runs
    crasher = queue.enqueue("examples.exit", 3, group="a", max_crashes=2).id
    after = queue.enqueue("tests.echo", "after", group="a").id
    with supervisor(tmp_path, redis_url, queue, lease_ttl="30s") as sup:
        job = wait_job(queue, crasher, sup=sup)
        assert job.state == "dead" and job.crashes == 2, job.history
        assert wait_job(queue, after, sup=sup).state == "succeeded"
        spans = lease_spans(queue.get(crasher)) + lease_spans(queue.get(after))
        assert len(spans) == 3
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, spans
    assert_no_slot_left(queue)


@pytest.mark.timeout(90)
def test_sigkilled_supervisors_slot_comes_back_by_reclaim(tmp_path, redis_url, queue):
    gate = tmp_path / "gate"
    first = queue.enqueue("tests.wait_file", str(gate), group="a").id
    second = queue.enqueue("tests.echo", "second", group="a").id
    with supervisor(tmp_path, redis_url, queue, lease_ttl="1s", name="one") as one:
        wait_job(queue, first, ("active",), sup=one)
        one.kill()  # no drain, no report: the lease (and the group's slot) stay taken
    assert state(queue, first) == "active"
    assert queue.redis.hgetall(queue.keys.groups_running) == {"a": "1"}
    with supervisor(tmp_path, redis_url, queue, lease_ttl="1s", name="two",
                    reaper_interval="100ms") as two:
        # reclaimed (the slot freed in the same script), then leased again by `two`
        wait_for(lambda: any(e["event"] == "reclaimed" for e in queue.get(first).history),
                 timeout=30, message="the reaper to reclaim the dead supervisor's lease")
        wait_job(queue, first, ("active",), sup=two)
        assert state(queue, second) == "pending"
        gate.touch()
        assert wait_job(queue, first, sup=two).state == "succeeded"
        assert wait_job(queue, second, sup=two).state == "succeeded"
    assert_no_slot_left(queue)


@pytest.mark.timeout(90)
def test_cancelling_a_running_grouped_job_frees_its_slot(tmp_path, redis_url, queue):
    blocked = queue.enqueue("tests.wait_file", str(tmp_path / "never"), group="a").id
    pending = queue.enqueue("tests.wait_file", str(tmp_path / "never"), group="a").id
    after = queue.enqueue("tests.echo", "after", group="a").id
    with supervisor(tmp_path, redis_url, queue) as sup:
        wait_job(queue, blocked, ("active",), sup=sup)
        assert queue.cancel(pending) == "cancelled"  # pending: leaves its group
        assert queue.cancel(blocked) == "cancelling"
        assert wait_job(queue, blocked, sup=sup).state == "cancelled"
        assert wait_job(queue, after, sup=sup).state == "succeeded"
    assert_no_slot_left(queue)


@pytest.mark.timeout(90)
def test_group_rate_limit_spaces_each_groups_starts(tmp_path, redis_url, queue):
    a = [queue.enqueue("tests.echo", i, group="a").id for i in range(5)]
    b = [queue.enqueue("tests.echo", i, group="b").id for i in range(5)]
    extra = 'group_concurrency = 10\ngroup_rate_limit = "5/s"\n'
    with supervisor(tmp_path, redis_url, queue, queue_extra=extra) as sup:
        for job_id in (*a, *b):
            assert wait_job(queue, job_id, sup=sup).state == "succeeded"
    assert queue.limits()["group_concurrency"] == 10
    starts = {g: [lease_spans(queue.get(j))[0][0] for j in ids]
              for g, ids in (("a", a), ("b", b))}
    for g, times in starts.items():
        gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
        assert min(gaps) >= 0.199, (g, gaps)  # one token per 200 ms per group
    # the groups' buckets are their own: b's first job did not wait for a's tokens
    assert abs(starts["a"][0] - starts["b"][0]) < 0.15, starts
    assert_no_slot_left(queue)


# -- config and CLI ---------------------------------------------------------------------------


QUEUE = '[redis]\nurl = "redis://127.0.0.1:1/0"\n[[queue]]\nname = "q"\nconcurrency = 1\n'


def test_config_reads_the_group_keys(tmp_path):
    path = tmp_path / "forq.toml"
    path.write_text(QUEUE + 'group_concurrency = 3\ngroup_rate_limit = "10/m"\n')
    queue = load_config(str(path), env={}).queue("q")
    assert (queue.group_concurrency, queue.group_rate_limit) == (3, (10.0, 60.0))
    path.write_text(QUEUE)
    queue = load_config(str(path), env={}).queue("q")
    assert (queue.group_concurrency, queue.group_rate_limit) == (None, None)


@pytest.mark.parametrize("line,message", [
    ("group_concurrency = 0", "[queue 1].group_concurrency: expected an integer >= 1, got 0"),
    ('group_concurrency = "1"', "[queue 1].group_concurrency: expected an integer"),
    ('group_rate_limit = "fast"', "[queue 1].group_rate_limit: expected a rate such as"),
])
def test_config_refuses_bad_group_keys(tmp_path, line, message):
    path = tmp_path / "forq.toml"
    path.write_text(QUEUE + line + "\n")
    with pytest.raises(ConfigError, match="^" + str(path) + ": ") as info:
        load_config(str(path), env={})
    assert message in str(info.value)


def forq(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url,
                           *args], capture_output=True, text=True, timeout=30, cwd=str(REPO))


def one_line(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_cli_enqueue_group_and_limit(redis_url, queue):
    done = forq(redis_url, "enqueue", "tests.echo", "-q", queue.name, "--group", "cust-1")
    assert done.returncode == 0, done.stderr
    assert queue.get(done.stdout.strip()).fields["group"] == "cust-1"
    one_line(forq(redis_url, "enqueue", "tests.echo", "-q", queue.name, "--group", ""),
             "group must not be empty")
    one_line(forq(redis_url, "enqueue", "tests.echo", "-q", queue.name, "--group", "x" * 300),
             "group is 300 bytes, over the 256-byte cap")

    shown = forq(redis_url, "limit", queue.name, "--group-concurrency", "3",
                 "--group-rate", "5/s")
    assert shown.returncode == 0, shown.stderr
    assert "per group: concurrency 3, rate 5/s" in shown.stdout
    assert queue.limits()["group_concurrency"] == 3
    cleared = forq(redis_url, "limit", queue.name, "--group-concurrency", "none",
                   "--group-rate", "none")
    assert "per group: concurrency 1, rate none" in cleared.stdout
    one_line(forq(redis_url, "limit", queue.name, "--group-concurrency", "0"),
             "--group-concurrency: expected an integer >= 1")
    one_line(forq(redis_url, "limit", queue.name, "--group-rate", "often"), "--group-rate")


# -- hostile ----------------------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("group,why", [
    ("x" * 257, "group is 257 bytes, over the 256-byte cap"),
    ("", "group must not be empty"),
    (["a"], "group must be str, got list"),
])
def test_a_follow_up_with_a_bad_group_is_refused(tmp_path, redis_url, queue, group, why):
    """A child writes its own result message with a follow-up whose group a producer
    could not have passed: that job fails naming it; the supervisor and the queue's
    groups are untouched."""
    job_id = "h" + queue.name
    spec = {"id": f"{job_id}-1", "task": "tests.echo", "args": "[]", "kwargs": "{}",
            "queue": queue.name, "parent": job_id, "group": group}
    message = {"t": "result", "ok": True, "result": None, "followups": [spec]}
    data = base64.b64encode(encode(message)).decode()
    with supervisor(tmp_path, redis_url, queue) as sup:
        queue.enqueue("hostile.pipe", data, job_id=job_id, max_crashes=1)
        done = wait_job(queue, job_id, ("dead",), sup=sup)
        assert any(why in e.get("reason", "") for e in done.history), done.history
        ok = queue.enqueue("tests.echo", "still here", group="g")
        assert ok.wait(timeout=20) == {"args": ["still here"], "kwargs": {}}
        assert "Traceback" not in sup.log()
    assert not queue.redis.exists(queue.keys.job(f"{job_id}-1"))
    assert_no_slot_left(queue)
