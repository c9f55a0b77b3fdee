"""A handler in control (issue 29, item 1): its own retry (`raise Retry(...)`, a snooze)
and its throttle of its queue or group (`current().throttle`), through real supervisors,
the Lua scripts on a real Redis, and what a hostile child may send for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forq import Queue, Retry
from forq.registry import JobContext, Throttled
from forq.supervisor.children.reader import MessageReader
from forq.supervisor.cli import render
from forq.supervisor.fork.messages import encode
from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for, wait_job
from tests.supervisors import REPO, TEST_IMPORTS, SupervisorProcess, write_config

pytestmark = pytest.mark.timeout(90)

IMPORTS = (*TEST_IMPORTS, "tests.control_tasks")
ERROR = {"type": "Retry", "message": "later", "traceback": "", "reason": "later"}


def starts(path: Path) -> list[float]:
    """The start times a handler marked, in order."""
    return [float(t) for t in path.read_text().split()] if path.exists() else []


@pytest.fixture
def sup(tmp_path, redis_url, queue):
    """A supervisor on `queue` (2 children), throttles capped at 1 s."""
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2}, imports=IMPORTS,
                          queue_extra='max_throttle = "1s"')
    proc = SupervisorProcess(config).start()
    yield proc
    proc.stop()


# -- Retry: a snooze -------------------------------------------------------------------


def test_a_handler_snoozes_on_its_own_terms_without_spending_attempts(sup, queue, tmp_path):
    runs = tmp_path / "runs"
    job = queue.enqueue("control.snooze", str(runs), 2, 0.3)
    done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
    assert done.state == "succeeded", done.history
    assert done.result == {"runs": 3, "attempts": 0}  # no attempt counted
    assert done.attempts == 1 and done.snoozes == 2  # the run that succeeded only
    snoozed = [e for e in done.history if e["event"] == "snoozed"]
    assert [e["reason"] for e in snoozed] == ["not yet (1)", "not yet (2)"]
    assert [e["snoozes"] for e in snoozed] == [1, 2] and not any("counted" in e for e in snoozed)
    times = starts(runs)
    assert all(b - a >= 0.29 for a, b in zip(times, times[1:], strict=False)), times
    assert "snoozes 2" in render.job(done)
    assert queue.stats()["totals"]["snoozed"] == 2
    assert "Traceback" not in sup.log()


def test_retry_at_a_time_counted_as_an_attempt_ends_at_max_attempts(sup, queue, tmp_path):
    runs = tmp_path / "runs"
    job = queue.enqueue("control.snooze", str(runs), 10, 0.2, True, True, max_attempts=2)
    done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
    assert done.state == "dead" and done.attempts == 2 and done.snoozes == 2, done.history
    assert done.reason == "not yet (2) (attempts exhausted: 2)"
    assert [e.get("counted") for e in done.history if e["event"] == "snoozed"] == [True]
    times = starts(runs)
    assert len(times) == 2 and times[1] - times[0] >= 0.15, times


def test_a_job_cannot_snooze_forever_past_max_snoozes_it_is_dead(sup, queue, tmp_path):
    runs = tmp_path / "runs"
    job = queue.enqueue("control.snooze", str(runs), 1000, 0, max_snoozes=2)
    done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
    assert done.state == "dead" and done.snoozes == 3 and done.attempts == 0, done.history
    assert done.reason == "not yet (3) (snoozed 3 times, over max_snoozes 2)"
    assert len(starts(runs)) == 3
    assert queue.dead()[0].id == job.id


def test_an_async_handler_snoozes_too(sup, queue, tmp_path):
    job = queue.enqueue("control.async_snooze", str(tmp_path / "runs"), 1)
    assert job.wait(timeout=20) == 2
    assert queue.get(job.id).snoozes == 1


def test_a_bad_retry_is_an_error_of_the_handler_naming_it():
    with pytest.raises(ValueError, match="Retry: .* is over the 720 h"):
        Retry(in_="31d")
    with pytest.raises(ValueError, match="give in_ or at, not both"):
        Retry(in_=1, at=2)
    with pytest.raises(ValueError, match="Retry: expected a duration"):
        Retry(in_="soon")
    assert Retry(at=0).delay_ms == 0  # in the past: due now
    assert str(Retry("1.5s")) == "retry in 1.5s" and Retry("2s", reason="x").reason == "x"


def test_snoozes_in_lua_fenced_capped_and_cancelled(queue):
    calls = leasing(queue)
    job = queue.enqueue("x.y", max_snoozes=5)
    lease = calls.claim("me", 1, 60_000).leases[0]
    assert calls.fail(lease.id, "stale", ERROR, "snooze", delay_ms=10).outcome == "lost"
    snoozed = calls.fail(lease.id, lease.token, ERROR, "snooze", delay_ms=60_000)
    record = queue.get(job.id)
    assert snoozed.outcome == "snoozed" and record.state == "scheduled"
    assert record.fields["run_at"] == snoozed.run_at_ms and record.error is None
    assert 59_000 < snoozed.run_at_ms - record.history[-1]["at"] * 1000 <= 60_000
    # a requested cancel is not snoozed
    queue.redis.zadd(queue.keys.scheduled, {job.id: 0})
    lease = calls.claim("me", 1, 60_000).leases[0]
    assert queue.cancel(job.id) == "cancelling"
    assert calls.fail(lease.id, lease.token, ERROR, "snooze", delay_ms=10).outcome == "cancelled"
    assert queue.get(job.id).state == "cancelled"


# -- throttle -----------------------------------------------------------------------


def test_a_throttle_pauses_its_queue_on_every_supervisor_and_the_job_waits(
        sup, tmp_path, redis_url, queue):
    config = write_config(tmp_path / "second.toml", redis_url, {queue.name: 2},
                          imports=IMPORTS, queue_extra='max_throttle = "1s"')
    second = SupervisorProcess(config).start()
    try:
        runs, others = tmp_path / "runs", tmp_path / "others"
        job = queue.enqueue("control.throttle", str(runs), "800ms")
        wait_for(lambda: queue.get(job.id).history[-1]["event"] == "throttled", timeout=20,
                 message="the throttle reported")
        left = queue.throttled()
        assert left is not None and 0.3 < left <= 0.8, left
        back = queue.get(job.id)
        assert back.state == "pending" and back.attempts == 0 and back.snoozes == 1
        throttled = back.history[-1]
        assert throttled["reason"] == "429 from upstream" and throttled["scope"] == "queue"
        other = queue.enqueue("control.mark", str(others))
        assert job.wait(timeout=20) == 2 and other.wait(timeout=20) is None
        ends = starts(runs)[0] + 0.8
        # neither supervisor started a job of the queue before the throttle ended
        assert starts(runs)[1] >= ends - 0.05 and starts(others)[0] >= ends - 0.05, (
            starts(runs), starts(others))
        assert queue.get(job.id).attempts == 1  # the run that succeeded only
    finally:
        second.stop()
    assert "Traceback" not in sup.log() + second.log()


def test_a_throttle_is_cut_to_the_queues_max_throttle(sup, queue, tmp_path):
    runs = tmp_path / "runs"
    job = queue.enqueue("control.throttle", str(runs), "1h")
    assert job.wait(timeout=20) == 2
    first, second = starts(runs)
    assert 0.9 <= second - first < 5, (first, second)  # max_throttle = "1s", not an hour
    assert queue.get(job.id).history[2]["until"] > 0


def test_a_group_throttle_holds_that_group_only(sup, queue, tmp_path):
    runs, same, other = tmp_path / "runs", tmp_path / "same", tmp_path / "other"
    job = queue.enqueue("control.throttle", str(runs), "1s", True, group="g1")
    wait_for(lambda: queue.throttled(group="g1") is not None, timeout=20,
             message="group g1 throttled")
    assert queue.throttled() is None  # the queue itself is not
    blocked = queue.enqueue("control.mark", str(same), group="g1")
    free = queue.enqueue("control.mark", str(other), group="g2")
    assert free.wait(timeout=10) is None
    assert queue.get(blocked.id).state == "pending"  # its group waits
    assert blocked.wait(timeout=20) is None and job.wait(timeout=20) == 2
    ends = starts(runs)[0] + 1.0
    assert starts(other)[0] < ends - 0.3 and starts(same)[0] >= ends - 0.05, (
        starts(runs), starts(same), starts(other))
    entry = next(e for e in queue.get(job.id).history if e["event"] == "throttled")
    assert entry["scope"] == "group" and entry["group"] == "g1"


def test_a_job_cannot_throttle_forever_past_max_snoozes_it_is_dead(sup, queue, tmp_path):
    job = queue.enqueue("control.throttle", str(tmp_path / "runs"), "10ms", False, 1000,
                        max_snoozes=2)
    done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
    assert done.state == "dead" and done.snoozes == 3, done.history
    assert done.reason == ("429 from upstream (throttled; snoozed 3 times, over "
                           "max_snoozes 2)")
    assert [e["event"] for e in done.history].count("throttled") == 2


def test_except_exception_does_not_swallow_a_throttle(sup, queue, tmp_path):
    job = queue.enqueue("control.swallow_throttle", str(tmp_path / "runs"))
    assert job.wait(timeout=20) == 2


def test_a_group_throttle_of_a_job_without_a_group_is_an_error_naming_it():
    ctx = JobContext("j1", "q", "t")
    with pytest.raises(ValueError, match="job j1 has no group"):
        ctx.throttle("1s", group=True)
    with pytest.raises(Throttled):
        JobContext("j1", "q", "t", group="g").throttle("1s", group=True)
    with pytest.raises(ValueError, match="throttle: .* is over the 24 h"):
        ctx.throttle("2d")


def test_throttles_in_lua_fenced_kept_when_longer_cancelled_and_lifted(queue):
    calls = leasing(queue)
    job = queue.enqueue("x.y")
    lease = calls.claim("me", 1, 60_000).leases[0]
    assert calls.throttle(lease.id, "stale", 1000, False, "r").outcome == "lost"
    queue.throttle("1h")
    reply = calls.throttle(lease.id, lease.token, 1000, False, "r")
    assert reply.outcome == "throttled" and queue.throttled() > 3000  # the longer stays
    claim = calls.claim("me", 5, 60_000)
    assert claim.leases == [] and claim.next_due_ms == reply.until_ms
    assert queue.unthrottle() and not queue.unthrottle()
    lease = calls.claim("me", 1, 60_000).leases[0]
    assert lease.id == job.id
    assert queue.cancel(job.id) == "cancelling"
    assert calls.throttle(lease.id, lease.token, 1000, False, "r").outcome == "cancelled"
    assert queue.get(job.id).state == "cancelled" and queue.throttled() is not None
    # a group throttle of a job without a group throttles nothing; 0 ms nothing either
    job = queue.enqueue("x.y")
    queue.unthrottle()
    lease = calls.claim("me", 1, 60_000).leases[0]
    assert calls.throttle(lease.id, lease.token, 1000, True, "r").until_ms == 0
    assert queue.throttled() is None and queue.get(job.id).state == "pending"


def test_forq_throttle_shows_sets_and_lifts(queue, redis_url):
    def forq(*args: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url, "throttle",
             queue.name, *args, "--json"], capture_output=True, text=True, timeout=30,
            cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    queue.enqueue("x.y")  # the queue exists
    assert forq()["throttled_for"] is None
    assert 50 < forq("60s")["throttled_for"] <= 60
    assert 50 < queue.stats()["throttled_for"] <= 60
    assert "(throttled " in render.stats_table({queue.name: queue.stats()})
    assert forq("5s", "--group", "g1")["throttled_for"] <= 5
    assert forq("--off") == {"queue": queue.name, "group": None, "throttled_for": None,
                             "lifted": True}
    assert queue.throttled(group="g1") is not None
    done = subprocess.run(
        [sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url, "throttle",
         queue.name, "forever"], capture_output=True, text=True, timeout=30, cwd=str(REPO),
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 2 and "throttle: expected a duration" in done.stderr
    assert "Traceback" not in done.stderr


# -- what a child may send for them ----------------------------------------------------


HOSTILE = [
    ({"retry": {"delay_ms": -1}}, "retry.delay_ms must be an integer from 0"),
    ({"retry": {"delay_ms": 31 * 86_400_000}}, "retry.delay_ms must be an integer from 0"),
    ({"retry": {"delay_ms": 1.5}}, "retry.delay_ms must be an integer"),
    ({"retry": {"delay_ms": True}}, "retry.delay_ms must be an integer"),
    ({"retry": {"delay_ms": 10, "counted": "yes"}}, "retry.counted must be true or false"),
    ({"retry": {"delay_ms": 10, "queue": "other"}}, "retry has unknown field(s) queue"),
    ({"retry": [10]}, "retry must be an object"),
    ({"throttle": {"delay_ms": 86_400_001}}, "throttle.delay_ms must be an integer from 0"),
    ({"throttle": {"delay_ms": 10, "queue": "other"}}, "throttle has unknown field(s) queue"),
    ({"throttle": {"delay_ms": 10, "group": True}}, "throttle.group for a job that has no group"),
    ({"throttle": {"delay_ms": 10}, "retry": {"delay_ms": 10}}, "at most one of"),
    ({"retry": {"delay_ms": 10}, "fatal": True}, "at most one of"),
]


@pytest.mark.parametrize(("extra", "why"), HOSTILE, ids=range(len(HOSTILE)))
def test_the_parent_checks_a_retry_and_a_throttle(extra, why):
    reader = MessageReader("j1", 1 << 20, queue="q")
    reader.feed(encode({"t": "result", "ok": False, "error": ERROR, **extra}))
    assert why in reader.violation, reader.violation


def test_a_well_formed_retry_and_throttle_are_read():
    reader = MessageReader("j1", 1 << 20, queue="q", group="g")
    reader.feed(encode({"t": "result", "ok": False, "error": ERROR,
                        "throttle": {"delay_ms": 10, "group": True}}))
    assert not reader.violation and reader.report.throttle == (10, True)
    reader = MessageReader("j1", 1 << 20, queue="q")
    reader.feed(encode({"t": "result", "ok": False, "error": ERROR,
                        "retry": {"delay_ms": 0, "counted": True}}))
    assert not reader.violation and reader.report.snooze == (0, True)


def test_a_hostile_child_cannot_throttle_another_queue(sup, queue, r):
    """The message names no queue: the parent throttles the job's own; one that tries
    to name another is a violation (a crash of that job), and the other queue runs on."""
    import base64

    victim = Queue(queue.name + "-victim", redis=r)
    message = {"t": "result", "ok": False, "error": ERROR,
               "throttle": {"delay_ms": 1000, "queue": victim.name}}
    job = queue.enqueue("hostile.pipe", base64.b64encode(encode(message)).decode(),
                        max_crashes=1)
    done = wait_job(queue, job.id, ("dead",), context=sup.log)
    assert any("throttle has unknown field(s) queue" in e.get("reason", "")
               for e in done.history), done.history
    assert victim.throttled() is None and queue.throttled() is None
