"""Groups (per-key concurrency and rate) through the scripts, on a real Redis.

Each test drives the transitions with `Queue` and checks both what claim hands out and
the group bookkeeping it leaves behind (`groups:running`, `groups:ready`, ...), so a
transition that forgets to free a group's slot fails here. The supervisor-level tests
(a real supervisor, crashes, SIGKILL) are in tests/test_groups_supervisor.py.
"""

from __future__ import annotations

import json

import pytest

from forq import PayloadError, Queue
from forq.payload import MAX_GROUP_BYTES, check_followup
from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for

OWNER = "host-a:100"
LONG = 60_000


def redis_ms(r) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def claim_ids(queue: Queue, n: int = 10, ttl: int = LONG) -> list[str]:
    return [lease.id for lease in leasing(queue).claim(OWNER, n, ttl).leases]


def claim(queue: Queue, n: int = 10, ttl: int = LONG):
    return leasing(queue).claim(OWNER, n, ttl).leases


def running(queue: Queue) -> dict[str, str]:
    return queue.redis.hgetall(queue.keys.groups_running)


def ready(queue: Queue) -> list[str]:
    return queue.redis.zrange(queue.keys.groups_ready, 0, -1)


def group_pending(queue: Queue) -> int:
    return int(queue.redis.get(queue.keys.groups_pending) or 0)


def enqueue_in(queue: Queue, group: str | None, n: int, **options) -> list[str]:
    return [queue.enqueue("t.task", i, group=group, **options).id for i in range(n)]


# -- limits ---------------------------------------------------------------------------


def test_one_job_per_group_by_default_other_groups_flow(queue):
    a = enqueue_in(queue, "a", 3)
    b = enqueue_in(queue, "b", 3)
    plain = enqueue_in(queue, None, 2)
    got = claim_ids(queue, 10)
    # one of each group (their heads, in enqueue order) and every ungrouped job
    assert got == [a[0], b[0], *plain]
    assert running(queue) == {"a": "1", "b": "1"}
    assert ready(queue) == []
    assert claim_ids(queue, 10) == []
    assert queue.stats()["pending"] == 4  # the grouped ones count as pending


def test_group_concurrency_n(queue):
    queue.set_limits(group_concurrency=2)
    a = enqueue_in(queue, "a", 5)
    assert claim_ids(queue, 10) == a[:2]
    assert running(queue) == {"a": "2"}


def test_a_saturated_group_does_not_block_others(queue):
    """Head-of-line: 1,000 jobs of one group ahead of one job of another; the claim
    reaches the other group's job at once."""
    queue.enqueue_many([{"task": "t.task", "group": "big"} for _ in range(1000)])
    late = queue.enqueue("t.task", group="small").id
    plain = queue.enqueue("t.task").id
    assert claim_ids(queue, 1)  # big's head
    assert claim_ids(queue, 5) == [late, plain]


def test_ack_frees_the_slot_and_the_next_job_of_the_group_runs(queue):
    a = enqueue_in(queue, "a", 2)
    (lease,) = claim(queue)
    assert leasing(queue).ack(lease.id, lease.token, "null") == "ok"
    assert running(queue) == {}
    assert claim_ids(queue) == [a[1]]


def test_batched_ack_frees_each_jobs_slot(queue):
    queue.set_limits(group_concurrency=2)
    a = enqueue_in(queue, "a", 4)
    leases = claim(queue)
    assert [le.id for le in leases] == a[:2]
    assert leasing(queue).ack_many([(le.id, le.token, "1", ()) for le in leases]) == ["ok", "ok"]
    assert claim_ids(queue) == a[2:]


@pytest.mark.parametrize("mode,outcome", [("retry", "retry"), ("fatal", "dead"),
                                          ("cancel", "cancelled")])
def test_every_fail_outcome_frees_the_slot(queue, mode, outcome):
    a = enqueue_in(queue, "a", 2)
    (lease,) = claim(queue)
    assert leasing(queue).fail(lease.id, lease.token, {"message": "x"}, mode).outcome == outcome
    assert running(queue) == {}
    assert claim_ids(queue) == [a[1]]


def test_retry_comes_back_into_its_group(queue, r):
    a = enqueue_in(queue, "a", 1, backoff={"base": "1ms", "jitter": 0})
    (lease,) = claim(queue)
    run_at = leasing(queue).fail(lease.id, lease.token, {"message": "x"}).run_at_ms
    other = enqueue_in(queue, "a", 1)
    assert claim_ids(queue) == other  # the retry waits out its backoff
    wait_for(lambda: redis_ms(r) > run_at, timeout=5)
    assert claim_ids(queue) == []  # promoted into group a, which is full
    assert r.zscore(queue.keys.group_pending("a"), a[0]) is not None
    assert r.zscore(queue.keys.pending, a[0]) is None


def test_release_puts_the_job_back_at_the_head_of_its_group(queue):
    a = enqueue_in(queue, "a", 2)
    (lease,) = claim(queue)
    assert leasing(queue).release(lease.id, lease.token) == "ok"
    assert running(queue) == {}
    assert claim_ids(queue) == [a[0]]


def test_reclaim_frees_the_slot_of_an_expired_lease(queue, r):
    a = enqueue_in(queue, "a", 2)
    (lease,) = claim(queue, ttl=1)
    deadline = redis_ms(r) + 5
    wait_for(lambda: redis_ms(r) > deadline, timeout=5)
    assert leasing(queue).reclaim("reaper").to_pending == 1
    assert running(queue) == {}
    assert claim_ids(queue) == [a[0]]  # back at its group's head


def test_reclaim_to_dead_frees_the_slot(queue, r):
    a = enqueue_in(queue, "a", 2, max_crashes=1)
    (lease,) = claim(queue, ttl=1)
    assert leasing(queue).expire(lease.id, lease.token, "SIGKILL") == "ok"
    assert leasing(queue).reclaim("reaper").to_dead == 1
    assert running(queue) == {}
    assert claim_ids(queue) == [a[1]]


def test_cancel_pending_and_active_grouped_jobs(queue, r):
    a = enqueue_in(queue, "a", 3)
    assert queue.cancel(a[1]) == "cancelled"  # pending: leaves its group
    assert group_pending(queue) == 2
    (lease,) = claim(queue)
    assert queue.cancel(lease.id) == "cancelling"
    assert leasing(queue).fail(lease.id, lease.token, {"message": "cancelled"}, "cancel").outcome \
        == "cancelled"
    assert claim_ids(queue) == [a[2]]
    assert queue.cancel(a[2]) == "cancelling"
    # a drain's release of a cancel-requested job finishes it as cancelled: slot freed
    lease2 = queue.get(a[2])
    assert leasing(queue).release(a[2], lease2.fields["token"]) == "ok"
    assert queue.get(a[2]).state == "cancelled"
    assert running(queue) == {}
    assert group_pending(queue) == 0


def test_cancel_of_the_head_moves_the_groups_place(queue, r):
    first = queue.enqueue("t.task", group="a").id
    plain = queue.enqueue("t.task").id
    second = queue.enqueue("t.task", group="a").id
    assert queue.cancel(first) == "cancelled"
    # the group's score is now its new head's, which comes after `plain`
    assert claim_ids(queue) == [plain, second]


def test_requeue_dead_goes_back_into_the_group(queue, r):
    a = enqueue_in(queue, "a", 1)
    (lease,) = claim(queue)
    leasing(queue).fail(lease.id, lease.token, {"message": "x"}, "fatal")
    assert queue.requeue_dead([a[0]])[0] == 1
    assert r.zscore(queue.keys.group_pending("a"), a[0]) is not None
    assert claim_ids(queue) == a


def test_idempotent_job_recorded_done_frees_its_slot_at_claim(queue):
    a = enqueue_in(queue, "a", 2, idempotent=True)
    (lease,) = claim(queue, ttl=1)
    leasing(queue).record_done(lease.id, "7", 60_000)
    leasing(queue).release(lease.id, lease.token)  # the ack was lost; a drain gave it back
    # the claim finds a[0] done and succeeds it (its group's slot taken and freed, and
    # the supervisors woken); the group's next job goes to the next claim
    assert claim_ids(queue) == []
    assert queue.get(a[0]).state == "succeeded"
    assert claim_ids(queue) == [a[1]]
    assert running(queue) == {"a": "1"}


def test_priority_across_groups_and_plain_jobs(queue):
    low = queue.enqueue("t.task", group="a").id
    high = queue.enqueue("t.task", group="b", priority=5).id
    mid = queue.enqueue("t.task", priority=2).id
    assert claim_ids(queue, 3) == [high, mid, low]


def test_lowered_limit_holds_a_ready_group(queue):
    queue.set_limits(group_concurrency=3)
    a = enqueue_in(queue, "a", 4)
    assert claim_ids(queue, 1) == a[:1]
    queue.set_limits(group_concurrency=1)
    assert claim_ids(queue, 5) == []
    assert ready(queue) == []
    queue.set_limits(group_concurrency=None)  # back to the default, 1


def test_raised_limit_applies_when_a_slot_frees(queue):
    a = enqueue_in(queue, "a", 4)
    (lease,) = claim(queue)
    queue.set_limits(group_concurrency=3)
    leasing(queue).ack(lease.id, lease.token, "null")
    assert claim_ids(queue) == a[1:4]


def test_group_rate_limit(queue, r):
    queue.set_limits(group_concurrency=100, group_rate=(1, 0.2))  # 5/s per group
    a = enqueue_in(queue, "a", 3)
    b = enqueue_in(queue, "b", 1)
    result = leasing(queue).claim(OWNER, 10, LONG)
    assert [le.id for le in result.leases] == [a[0], b[0]]  # one token each
    assert r.zrange(queue.keys.groups_wait, 0, -1) == ["a"]
    # the claim says when group a's next token comes
    assert 0 < result.next_due_ms - result.now_ms <= 200
    due = result.next_due_ms
    wait_for(lambda: redis_ms(r) >= due, timeout=5)
    assert claim_ids(queue) == [a[1]]


def test_group_wakes_supervisors_when_its_slot_frees(queue, r):
    enqueue_in(queue, "a", 2)
    (lease,) = claim(queue)
    sub = r.pubsub(ignore_subscribe_messages=True)
    sub.subscribe(queue.keys.wake)
    wait_for(lambda: sub.get_message(timeout=0.1) is None, timeout=5)
    leasing(queue).ack(lease.id, lease.token, "null")
    message = sub.get_message(timeout=5)
    sub.close()
    assert message and message["data"] == "0"


def test_plain_queue_never_touches_group_keys(queue, r):
    enqueue_in(queue, None, 3)
    for lease in claim(queue):
        leasing(queue).ack(lease.id, lease.token, "null")
    assert not list(r.scan_iter(match=f"forq:{{{queue.name}}}:g*"))
    assert "grouped" not in r.hgetall(queue.keys.limits)


def test_many_groups_drain_with_no_slot_left(queue, r):
    queue.enqueue_many([{"task": "t.task", "group": f"g{i % 50}"} for i in range(500)])
    done = 0
    while done < 500:
        leases = claim(queue, 32)
        assert leases
        assert len({queue.get(le.id).fields["group"] for le in leases}) == len(leases)
        leasing(queue).ack_many([(le.id, le.token, "null", ()) for le in leases])
        done += len(leases)
    assert running(queue) == {}
    assert ready(queue) == []
    assert group_pending(queue) == 0


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("group,match", [
    ("", "group must not be empty"),
    ("x" * (MAX_GROUP_BYTES + 1), "over the 256-byte cap"),
    ("é" * (MAX_GROUP_BYTES // 2 + 1), "over the 256-byte cap"),
    (42, "group must be a string, got int"),
    (["a"], "group must be a string, got list"),
    ("\ud800", "lone surrogate"),
])
def test_bad_group_is_refused_naming_it(queue, group, match):
    with pytest.raises(PayloadError, match=match):
        queue.enqueue("t.task", group=group)
    with pytest.raises(PayloadError, match=r"jobs\[1\]: .*" + match):
        queue.enqueue_many([{"task": "t.task"}, {"task": "t.task", "group": group}])
    assert queue.stats()["pending"] == 0


def test_group_at_the_cap_and_odd_characters_work(queue):
    for group in ("x" * MAX_GROUP_BYTES, "{braces}:colon space\n", "ü" * 128):
        job = queue.enqueue("t.task", group=group)
        (lease,) = claim(queue)
        assert lease.id == job.id and lease.job.fields["group"] == group
        leasing(queue).ack(lease.id, lease.token, "null")
    assert running(queue) == {}


def test_followup_group_is_checked():
    spec = {"id": "p-1", "parent": "p", "task": "t", "args": "[]", "kwargs": "{}",
            "queue": "q", "group": "x" * (MAX_GROUP_BYTES + 1)}
    assert "256-byte cap" in check_followup(spec, "p", 1)
    spec["group"] = 7
    assert "group must be str" in check_followup(spec, "p", 1)
    spec["group"] = "ok"
    assert check_followup(spec, "p", 1) == ""


def test_bad_group_concurrency_is_refused(queue):
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="group_concurrency must be an integer >= 1"):
            queue.set_limits(group_concurrency=bad)


def test_group_is_in_the_record_and_in_json(queue):
    job = queue.enqueue("t.task", group="customer-42")
    assert queue.get(job.id).fields["group"] == "customer-42"
    assert json.loads(json.dumps(queue.get(job.id).fields))["group"] == "customer-42"


def test_removed_group_rate_lets_a_waiting_group_go(queue, r):
    queue.set_limits(group_concurrency=10, group_rate=(1, 0.3))
    a = enqueue_in(queue, "a", 3)
    result = leasing(queue).claim(OWNER, 10, LONG)
    assert [le.id for le in result.leases] == a[:1]
    assert r.zrange(queue.keys.groups_wait, 0, -1) == ["a"]
    queue.set_limits(group_rate=None)
    due = result.next_due_ms
    wait_for(lambda: redis_ms(r) >= due, timeout=5)
    assert claim_ids(queue) == a[1:]  # no rate now: both at once
    assert r.zcard(queue.keys.groups_wait) == 0


def test_async_queue_enqueues_into_groups(queue, redis_url):
    import asyncio

    from forq import AsyncQueue

    async def body() -> tuple[str, list[str]]:
        async with AsyncQueue(queue.name, url=redis_url) as aq:
            one = await aq.enqueue("t.task", group="a")
            many = await aq.enqueue_many([{"task": "t.task", "group": "a"},
                                          {"task": "t.task", "group": "b"}])
            with pytest.raises(PayloadError, match="group must not be empty"):
                await aq.enqueue("t.task", group="")
            return one.id, [j.id for j in many]

    first, (second, other) = asyncio.run(body())
    assert claim_ids(queue) == [first, other]  # one per group
    assert queue.stats()["pending"] == 1
    assert queue.get(second).fields["group"] == "a"


def test_grouped_pending_jobs_count_in_stats_and_the_dashboard(queue):
    data = pytest.importorskip("forq.web.data")
    enqueue_in(queue, "a", 3)
    enqueue_in(queue, None, 1)
    assert claim_ids(queue, 10)
    assert queue.stats()["pending"] == 2
    overview = next(q for q in data.overview(queue.redis)["queues"] if q["name"] == queue.name)
    assert (overview["pending"], overview["active"]) == (2, 2)


def test_a_delayed_grouped_job_is_claimed_once_due(queue, r):
    """The queue's first grouped job is a delayed one: the claim that promotes it must
    look at the groups (the queue is marked grouped by the promotion, not only by a
    pending enqueue)."""
    job = queue.enqueue("t.task", group="a", delay="50ms")
    due = int(queue.get(job.id).fields["run_at"])
    wait_for(lambda: redis_ms(r) > due, timeout=5)
    assert claim_ids(queue) == [job.id]
    assert running(queue) == {"a": "1"}


def test_forq_job_shows_the_group(queue):
    from forq.supervisor.cli import render

    job = queue.enqueue("t.task", group="customer-42")
    assert any(line.split()[:2] == ["group", "customer-42"]
               for line in render.job(queue.get(job.id)).splitlines())
