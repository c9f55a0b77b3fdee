"""Change a job before it runs (issue 29 item 5): promote, reschedule, set_priority and
enqueue(lifo=True), through lua/promote.lua, reschedule.lua, set_priority.lua and the
pending score; the API, the asyncio API, the CLI and a real supervisor.

Each test reads the queue's sets and the job's record from Redis, so a script that
moves a job without its index (or the index without the record) fails here.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis as redis_lib

from forq import AsyncQueue, JobNotFound, JobStateError, PayloadError, Queue
from forq.store import transitions as tr
from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for, wait_job
from tests.supervisors import REPO, SupervisorProcess, write_config

OWNER = "change-test:1"
LONG = 60_000
TERMINAL = ("succeeded", "dead", "cancelled")


def redis_ms(client: redis_lib.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def where(queue: Queue, job_id: str) -> list[str]:
    r, k = queue.redis, queue.keys
    return [name for name, key in (("pending", k.pending), ("scheduled", k.scheduled),
                                   ("active", k.active), ("dead", k.dead),
                                   ("waiting", k.waiting))
            if r.zscore(key, job_id) is not None]


def claim_order(queue: Queue, n: int) -> list[str]:
    return [lease.id for lease in leasing(queue).claim(OWNER, n, LONG).leases]


def events(queue: Queue, job_id: str) -> list[str]:
    return [e["event"] for e in queue.get(job_id).history]


# -- promote ----------------------------------------------------------------------------


def test_promote_runs_a_scheduled_job_now_at_the_tail_of_its_priority(queue: Queue):
    first = queue.enqueue("t.a")
    later = queue.enqueue("t.b", delay="1h")
    assert where(queue, later.id) == ["scheduled"]
    assert queue.promote(later.id) == "pending"
    assert where(queue, later.id) == ["pending"]
    job = queue.get(later.id)
    assert job.state == "pending" and events(queue, later.id)[-1] == "promoted"
    assert abs(int(job.fields["run_at"]) - redis_ms(queue.redis)) < 5000
    assert claim_order(queue, 2) == [first.id, later.id]


def test_promote_keeps_a_retry_s_attempts(queue: Queue):
    job = queue.enqueue("t.a", max_attempts=3, backoff={"base": "1h"})
    lease = leasing(queue).claim(OWNER, 1, LONG).leases[0]
    assert leasing(queue).fail(job.id, lease.token, {"message": "x"}).outcome == "retry"
    assert where(queue, job.id) == ["scheduled"]
    queue.promote(job.id)
    assert queue.get(job.id).attempts == 1 and claim_order(queue, 1) == [job.id]


@pytest.mark.parametrize("state", ["pending", "active", "waiting", "dead", "cancelled"])
def test_promote_refuses_a_job_that_is_not_scheduled(queue: Queue, state: str):
    job = _job_in(queue, state)
    before = queue.redis.hgetall(queue.keys.job(job))
    with pytest.raises(JobStateError, match=f"job {job} in queue {queue.name} is {state}: "
                                            "only a scheduled job can be promoted") as caught:
        queue.promote(job)
    assert (caught.value.state, caught.value.action) == (state, "promote")
    assert queue.redis.hgetall(queue.keys.job(job)) == before


def test_change_a_missing_job_is_job_not_found(queue: Queue):
    for change in (lambda: queue.promote("nope"), lambda: queue.set_priority("nope", 3),
                   lambda: queue.reschedule("nope", delay="1m")):
        with pytest.raises(JobNotFound, match=f"no job nope in queue {queue.name}"):
            change()


def _job_in(queue: Queue, state: str) -> str:
    """A job of this queue in `state`."""
    if state == "pending":
        return queue.enqueue("t.a").id
    if state == "scheduled":
        return queue.enqueue("t.a", delay="1h").id
    if state == "waiting":
        parent = queue.enqueue("t.parent", delay="1h")
        return queue.enqueue("t.a", depends_on=[parent]).id
    job = queue.enqueue("t.a", priority=1000)
    lease = leasing(queue).claim(OWNER, 1, LONG).leases[0]
    assert lease.id == job.id
    if state == "dead":
        leasing(queue).fail(job.id, lease.token, {"message": "x"}, "fatal")
    elif state == "cancelled":
        leasing(queue).fail(job.id, lease.token, {"message": "x"}, "cancel")
    assert queue.get(job.id).state == state
    return job.id


# -- reschedule -------------------------------------------------------------------------


def test_reschedule_a_scheduled_job_later_and_earlier(queue: Queue):
    job = queue.enqueue("t.a", delay="1h")
    target = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=5)
    assert queue.reschedule(job.id, target) == "scheduled"
    assert queue.redis.zscore(queue.keys.scheduled, job.id) == int(target.timestamp() * 1000)
    assert int(queue.get(job.id).fields["run_at"]) == int(target.timestamp() * 1000)
    before = redis_ms(queue.redis)
    assert queue.reschedule(job.id, delay="10m") == "scheduled"
    due = queue.redis.zscore(queue.keys.scheduled, job.id)
    assert before + 600_000 <= due <= redis_ms(queue.redis) + 600_000
    assert events(queue, job.id)[-2:] == ["rescheduled", "rescheduled"]


def test_reschedule_to_now_or_the_past_makes_a_scheduled_job_pending(queue: Queue):
    job = queue.enqueue("t.a", delay="1h")
    assert queue.reschedule(job.id, 1_000_000) == "pending"  # 1970
    assert where(queue, job.id) == ["pending"]
    assert claim_order(queue, 1) == [job.id]


def test_reschedule_a_pending_job_moves_it_to_scheduled_then_it_runs(queue: Queue):
    job = queue.enqueue("t.a")
    other = queue.enqueue("t.b")
    assert queue.reschedule(job.id, delay="150ms") == "scheduled"
    assert where(queue, job.id) == ["scheduled"]
    assert "score" not in queue.get(job.id).fields
    assert claim_order(queue, 5) == [other.id]
    wait_for(lambda: claim_order(queue, 5) == [job.id], timeout=5,
             message="the rescheduled job claimable once due")


def test_reschedule_a_pending_job_to_now_leaves_it_in_its_place(queue: Queue):
    first, second = queue.enqueue("t.a"), queue.enqueue("t.b")
    assert queue.reschedule(first.id, delay=0) == "pending"
    assert claim_order(queue, 2) == [first.id, second.id]


def test_reschedule_a_grouped_pending_job_frees_its_group_s_head(queue: Queue):
    a = queue.enqueue("t.a", group="g")
    b = queue.enqueue("t.b", group="g")
    assert queue.reschedule(a.id, delay="1h") == "scheduled"
    assert queue.redis.zrange(queue.keys.group_pending("g"), 0, -1) == [b.id]
    assert int(queue.redis.get(queue.keys.groups_pending)) == 1
    assert claim_order(queue, 5) == [b.id]
    assert queue.stats()["pending"] == 0


def test_reschedule_refuses_a_time_past_the_job_s_expiry(queue: Queue):
    job = queue.enqueue("t.a", expires_in="10m")
    with pytest.raises(JobStateError, match="expiry before start .* could never run"):
        queue.reschedule(job.id, delay="1h")
    assert where(queue, job.id) == ["pending"]
    assert queue.reschedule(job.id, delay="5m") == "scheduled"


@pytest.mark.parametrize("state", ["waiting", "active", "dead", "cancelled"])
def test_reschedule_refuses_other_states(queue: Queue, state: str):
    job = _job_in(queue, state)
    with pytest.raises(JobStateError, match="only a pending or scheduled job can be rescheduled"):
        queue.reschedule(job, delay="1m")
    assert queue.get(job).state == state


@pytest.mark.parametrize("kwargs, needle", [
    ({}, "one of them"), ({"at": 1, "delay": "1s"}, "one of them"),
    ({"at": "tomorrow"}, "datetime or Unix seconds"), ({"at": float("nan")}, "Unix seconds"),
    ({"at": True}, "Unix seconds"), ({"delay": "soon"}, "delay"), ({"delay": True}, "duration"),
])
def test_reschedule_refuses_a_bad_time(queue: Queue, kwargs, needle):
    job = queue.enqueue("t.a", delay="1h")
    with pytest.raises(PayloadError, match=needle):
        queue.reschedule(job.id, **kwargs)


# -- set_priority -----------------------------------------------------------------------


def test_set_priority_moves_a_pending_job_at_once(queue: Queue):
    a, b, c = (queue.enqueue("t.x", priority=p) for p in (5, 5, 1))
    assert queue.set_priority(c.id, 9) == "pending"
    assert int(queue.get(c.id).fields["priority"]) == 9
    assert events(queue, c.id)[-1] == "priority"
    assert queue.get(c.id).history[-1]["from"] == 1
    assert queue.set_priority(a.id, 5) == "pending"  # same priority: to its tail
    assert claim_order(queue, 3) == [c.id, b.id, a.id]


def test_set_priority_of_a_scheduled_or_waiting_job_applies_when_it_is_pending(queue: Queue):
    low = queue.enqueue("t.low")
    later = queue.enqueue("t.later", delay="1h")
    parent = queue.enqueue("t.parent", priority=1000)
    child = queue.enqueue("t.child", depends_on=[parent])
    assert queue.set_priority(later.id, 7) == "scheduled"
    assert queue.set_priority(child.id, 8) == "waiting"
    assert where(queue, later.id) == ["scheduled"] and where(queue, child.id) == ["waiting"]
    lease = leasing(queue).claim(OWNER, 1, LONG).leases[0]
    assert lease.id == parent.id
    leasing(queue).ack(parent.id, lease.token, "null")  # releases the child
    queue.promote(later.id)
    assert claim_order(queue, 3) == [child.id, later.id, low.id]


def test_set_priority_of_a_grouped_job_reorders_its_group(queue: Queue):
    a = queue.enqueue("t.a", group="g")
    b = queue.enqueue("t.b", group="g")
    other = queue.enqueue("t.o", priority=3)
    queue.set_priority(b.id, 5)
    assert queue.redis.zrange(queue.keys.group_pending("g"), 0, -1) == [b.id, a.id]
    # the group's place in the ready set follows its new head: before the priority 3 job
    assert claim_order(queue, 3) == [b.id, other.id]


@pytest.mark.parametrize("state", ["active", "dead", "cancelled"])
def test_set_priority_refuses_a_running_or_finished_job(queue: Queue, state: str):
    job = _job_in(queue, state)
    with pytest.raises(JobStateError, match="only a pending, scheduled or waiting job"):
        queue.set_priority(job, 3)


@pytest.mark.parametrize("priority", [1001, -1001, 1.5, "3", True, None])
def test_set_priority_refuses_a_bad_priority(queue: Queue, priority):
    job = queue.enqueue("t.a")
    with pytest.raises(PayloadError, match="priority must be an integer"):
        queue.set_priority(job.id, priority)


@pytest.mark.parametrize("raw", ["1001", "1.5", "x", "nan", "inf"])
def test_the_script_refuses_a_bad_priority_sent_around_the_api(queue: Queue, raw: str):
    job = queue.enqueue("t.a")
    call = tr.ScriptCall("set_priority", (queue.keys.pending,), (queue.keys.prefix, job.id, raw))
    with pytest.raises(redis_lib.ResponseError, match="priority must be an integer"):
        queue.scripts.run(call)
    assert queue.get(job.id).fields["priority"] == 0


@pytest.mark.parametrize("raw", ["x", "nan", "1e400", ""])
def test_the_reschedule_script_refuses_a_time_that_is_not_one(queue: Queue, raw: str):
    job = queue.enqueue("t.a", delay="1h")
    call = tr.ScriptCall("reschedule", (queue.keys.scheduled, queue.keys.pending),
                         (queue.keys.prefix, job.id, raw, "in"))
    with pytest.raises(redis_lib.ResponseError, match="run-at must be a number"):
        queue.scripts.run(call)
    assert where(queue, job.id) == ["scheduled"]


# -- lifo -------------------------------------------------------------------------------


def test_lifo_jobs_go_to_the_head_of_their_priority_newest_first(queue: Queue):
    f1 = queue.enqueue("t.f1")
    l1 = queue.enqueue("t.l1", lifo=True)
    f2 = queue.enqueue("t.f2")
    l2 = queue.enqueue("t.l2", lifo=True)
    hi = queue.enqueue("t.hi", priority=1)
    lo_lifo = queue.enqueue("t.lo", priority=-1, lifo=True)
    assert queue.get(l1.id).fields["lifo"] == "1"
    assert claim_order(queue, 6) == [hi.id, l2.id, l1.id, f1.id, f2.id, lo_lifo.id]


def test_a_lifo_job_keeps_lifo_when_it_becomes_pending_later(queue: Queue):
    delayed = queue.enqueue("t.d", delay="1h", lifo=True)
    fifo = queue.enqueue("t.f")
    queue.promote(delayed.id)
    assert claim_order(queue, 2) == [delayed.id, fifo.id]


def test_lifo_at_the_priority_limits_stays_within_its_priority(queue: Queue):
    top_fifo = queue.enqueue("t.a", priority=1000)
    low_lifo = queue.enqueue("t.b", priority=999, lifo=True)
    bottom_lifo = queue.enqueue("t.c", priority=-1000, lifo=True)
    bottom_fifo = queue.enqueue("t.d", priority=-1000)
    above = queue.enqueue("t.e", priority=-999)
    assert claim_order(queue, 5) == [top_fifo.id, low_lifo.id, above.id, bottom_lifo.id,
                                     bottom_fifo.id]


def test_lifo_must_be_1_in_a_followup_spec():
    from forq.payload import check_followup

    spec = {"id": "p-1", "task": "t", "args": "[]", "kwargs": "{}", "queue": "q",
            "parent": "p", "lifo": 1}
    assert check_followup(spec, "p", 1) == ""
    assert "lifo must be 1" in check_followup(dict(spec, lifo=0), "p", 1)
    assert "lifo must be int" in check_followup(dict(spec, lifo="1"), "p", 1)


# -- asyncio ----------------------------------------------------------------------------


def test_async_queue_changes_jobs_with_the_same_scripts(redis_url: str, queue: Queue):
    async def main() -> None:
        async with AsyncQueue(queue.name, url=redis_url) as aq:
            job = await aq.enqueue("t.a", delay="1h", lifo=True)
            assert await aq.set_priority(job.id, 4) == "scheduled"
            assert await aq.reschedule(job.id, delay="2h") == "scheduled"
            assert await aq.promote(job.id) == "pending"
            with pytest.raises(JobStateError, match="is pending: only a scheduled job"):
                await aq.promote(job.id)
            with pytest.raises(JobNotFound):
                await aq.set_priority("nope", 1)

    asyncio.run(main())
    job = queue.get(queue.redis.zrange(queue.keys.pending, 0, 0)[0])
    assert (job.fields["priority"], job.fields["lifo"]) == (4, "1")
    assert [e["event"] for e in job.history][-3:] == ["priority", "rescheduled", "promoted"]


# -- the CLI ----------------------------------------------------------------------------


def forq(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url,
                           *args], capture_output=True, text=True, timeout=30, cwd=REPO)


def test_cli_promote_reschedule_priority_and_enqueue_lifo(redis_url: str, queue: Queue):
    done = forq(redis_url, "enqueue", "t.a", "-q", queue.name, "--delay", "1h", "--lifo")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert queue.get(job_id).fields["lifo"] == "1"
    done = forq(redis_url, "priority", job_id, "7")  # found by id alone
    assert done.returncode == 0 and "priority 7" in done.stdout, done.stderr
    done = forq(redis_url, "reschedule", job_id, "--in", "2h", "-q", queue.name, "--json")
    assert json.loads(done.stdout)["state"] == "scheduled", done.stderr
    done = forq(redis_url, "reschedule", job_id, "--at", "2030-01-02T03:04:05+00:00")
    assert done.returncode == 0, done.stderr
    assert queue.redis.zscore(queue.keys.scheduled, job_id) == 1893553445000
    done = forq(redis_url, "promote", job_id)
    assert done.returncode == 0 and "pending" in done.stdout, done.stderr
    done = forq(redis_url, "promote", job_id)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"job {job_id} in queue {queue.name} is pending" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, needle", [
    (["priority", "x", "5000"], "priority must be an integer"),
    (["priority", "x", "high"], "invalid int value"),
    (["reschedule", "x"], "--at TIME or --in DURATION"),
    (["reschedule", "x", "--at", "noon"], "--at"),
    (["reschedule", "x", "--in", "soon"], "--in"),
    (["promote", "missing-id"], "no job with id missing-id"),
])
def test_cli_bad_input_is_one_line(redis_url: str, queue: Queue, argv, needle):
    done = forq(redis_url, *argv)
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1


# -- a real supervisor ------------------------------------------------------------------


def test_supervisor_runs_a_promoted_job_at_once_and_a_rescheduled_one_when_due(
        tmp_path: Path, redis_url: str, queue: Queue):
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2})
    with SupervisorProcess(config).start() as sup:
        later = queue.enqueue("tests.echo", "later", delay="1h")
        pending = queue.enqueue("tests.echo", "pending", delay="1h")
        promoted_at = redis_ms(queue.redis)
        queue.promote(later.id)
        done = wait_job(queue, later.id, TERMINAL, timeout=10, context=lambda: sup.log()[-3000:])
        assert done.state == "succeeded"
        # woken by promote's publish, not found by the supervisor's safety-net poll
        assert int(done.fields["started_at"]) - promoted_at < 1500
        rescheduled_at = redis_ms(queue.redis)
        queue.reschedule(pending.id, delay="300ms")
        done = wait_job(queue, pending.id, TERMINAL, timeout=10, context=lambda: sup.log()[-3000:])
        assert done.state == "succeeded"
        assert 300 <= int(done.fields["started_at"]) - rescheduled_at < 1800
