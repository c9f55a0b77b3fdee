"""enqueue with a held key: replace=True (the waiting holder takes the new arguments and
time, in place), debounce= (one run after the last call, with its arguments) and
key_scope="queued" (one running, one more waiting), all inside the enqueue script
(lua/includes/replace.lua). Scripts driven directly; tests/test_events_supervisor.py
has them under a real supervisor."""

from __future__ import annotations

import pytest

from forq import PayloadError, Queue
from forq.registry import JobContext
from forq.supervisor.leases.calls import leasing

SUP = "host-a:100"


def claim(queue: Queue, n: int = 1):
    return leasing(queue).claim(SUP, n, 60_000).leases


def run_at(queue: Queue, job_id: str) -> int:
    return int(queue.get(job_id).fields["run_at"])


def test_replace_gives_the_waiting_holder_the_new_arguments_in_place(queue):
    first = queue.enqueue("sync", 1, key="user-7", replace=True, kwargs={"a": 1})
    again = queue.enqueue("sync", 2, key="user-7", replace=True)
    assert again.id == first.id
    assert (first.fields["enqueue_status"], again.fields["enqueue_status"]) == ("pending", "replaced")
    job = queue.get(first.id)
    assert (job.state, job.args, job.kwargs) == ("pending", [2], {})
    assert [h["event"] for h in job.history] == ["enqueued", "replaced"]
    assert queue.stats()["pending"] == 1 and queue.stats()["totals"]["enqueued"] == 1
    assert [e.kind for e in queue.events()] == ["enqueued", "replaced"]
    (lease,) = claim(queue)
    assert lease.job.args == [2]


def test_replace_without_a_time_keeps_the_place_and_with_one_moves_it(queue):
    ahead = queue.enqueue("a")
    held = queue.enqueue("b", key="k", replace=True)
    behind = queue.enqueue("c")
    queue.enqueue("b", 9, key="k", replace=True)  # no time: same place in pending
    assert queue.redis.zrange(queue.keys.pending, 0, -1) == [ahead.id, held.id, behind.id]
    queue.enqueue("b", 10, key="k", replace=True, delay="1h")  # pending -> scheduled
    job = queue.get(held.id)
    assert (job.state, job.args) == ("scheduled", [10])
    assert queue.redis.zscore(queue.keys.scheduled, held.id) == run_at(queue, held.id)
    assert queue.redis.zrange(queue.keys.pending, 0, -1) == [ahead.id, behind.id]
    queue.enqueue("b", 11, key="k", replace=True, delay=0)  # scheduled -> pending, due now
    assert queue.get(held.id).state == "pending"
    assert not queue.redis.zscore(queue.keys.scheduled, held.id)
    assert queue.redis.zrange(queue.keys.pending, 0, -1)[-1] == held.id  # at the back now
    assert [e.fields["state"] for e in queue.events() if e.kind == "replaced"] == \
        ["pending", "scheduled", "pending"]


def test_replace_of_a_grouped_holder_keeps_its_group_consistent(queue):
    held = queue.enqueue("g", 1, key="k", group="acct-1")
    queue.enqueue("g", 2, key="k", replace=True, delay="1h")
    assert queue.stats()["pending"] == 0 and queue.get(held.id).state == "scheduled"
    assert not queue.redis.zcard(queue.keys.group_pending("acct-1"))
    queue.enqueue("g", 3, key="k", replace=True, run_at=0)  # due: back in its group
    assert queue.stats()["pending"] == 1
    (lease,) = claim(queue)
    assert (lease.id, lease.job.args) == (held.id, [3])


def test_a_running_holder_is_not_replaced_the_call_is_a_duplicate(queue):
    held = queue.enqueue("t", 1, key="k")
    claim(queue)
    dup = queue.enqueue("t", 2, key="k", replace=True)
    assert (dup.id, dup.fields["enqueue_status"]) == (held.id, "duplicate")
    assert queue.get(held.id).args == [1]


def test_key_scope_queued_lets_one_run_and_one_wait(queue):
    running = queue.enqueue("t", 1, key="k", key_scope="queued")
    (lease,) = claim(queue)
    waiting = queue.enqueue("t", 2, key="k", key_scope="queued", replace=True)
    assert waiting.id != running.id and waiting.fields["enqueue_status"] == "pending"
    latest = queue.enqueue("t", 3, key="k", key_scope="queued", replace=True)
    assert (latest.id, latest.fields["enqueue_status"]) == (waiting.id, "replaced")
    assert queue.get(waiting.id).args == [3]
    no_replace = queue.enqueue("t", 4, key="k", key_scope="queued")
    assert (no_replace.id, no_replace.fields["enqueue_status"]) == (waiting.id, "duplicate")
    # the running one ends: the key stays with the waiting one
    leasing(queue).ack(running.id, lease.token, "1")
    assert queue.redis.get(queue.keys.prefix + "unique:k") == waiting.id
    again = queue.enqueue("t", 5, key="k", replace=True)
    assert again.id == waiting.id and queue.get(waiting.id).args == [5]


def test_a_finished_holder_kept_by_unique_for_is_not_replaced(queue):
    held = queue.enqueue("t", 1, key="k", unique_for="1h")
    (lease,) = claim(queue)
    leasing(queue).ack(held.id, lease.token, "1")
    dup = queue.enqueue("t", 2, key="k", replace=True)
    assert (dup.id, dup.fields["enqueue_status"]) == (held.id, "duplicate")


def test_replace_of_a_holder_waiting_on_its_dependencies(queue):
    parent = queue.enqueue("p")
    held = queue.enqueue("c", 1, key="k", depends_on=[parent.id])
    queue.enqueue("c", 2, key="k", replace=True, delay="1h")
    job = queue.get(held.id)
    assert (job.state, job.args) == ("waiting", [2])
    (lease,) = claim(queue)
    leasing(queue).ack(parent.id, lease.token, "1")
    assert queue.get(held.id).state == "scheduled"  # released to the time it was given


def test_debounce_runs_once_after_the_last_call_with_its_arguments(queue):
    first = queue.enqueue("reindex", 1, key="doc-9", debounce="10s")
    due_first = run_at(queue, first.id)
    for n in (2, 3, 4):
        job = queue.enqueue("reindex", n, key="doc-9", debounce="10s")
        assert job.id == first.id
    job = queue.get(first.id)
    assert (job.state, job.args) == ("scheduled", [4])
    assert run_at(queue, first.id) >= due_first  # moved to the last call's time + 10 s
    assert queue.stats()["scheduled"] == 1
    # due: promoted to pending by a claim, and a call then pushes it back
    queue.redis.zadd(queue.keys.scheduled, {first.id: 0})
    assert claim(queue, 0) == []  # a claim of none still promotes
    assert queue.get(first.id).state == "pending"
    queue.enqueue("reindex", 5, key="doc-9", debounce="10s")
    assert queue.get(first.id).state == "scheduled"


def test_debounce_while_the_last_run_runs_queues_one_more(queue):
    first = queue.enqueue("reindex", 1, key="doc-9", debounce="1ms")
    queue.redis.zadd(queue.keys.scheduled, {first.id: 0})
    (lease,) = claim(queue)
    later = queue.enqueue("reindex", 2, key="doc-9", debounce="10s")
    assert later.id != first.id and queue.get(later.id).state == "scheduled"
    live = queue.enqueue("reindex", 3, key="doc-9", debounce="10s", key_scope="live")
    assert live.id == later.id  # the held key is the waiting one's: replaced
    assert queue.get(later.id).args == [3]


def test_enqueue_many_with_one_key_keeps_the_last(queue):
    jobs = queue.enqueue_many([{"task": "t", "args": [n], "key": "k", "replace": True}
                               for n in range(5)])
    assert {j.id for j in jobs} == {jobs[0].id}
    assert [j.fields["enqueue_status"] for j in jobs] == ["pending"] + ["replaced"] * 4
    assert queue.get(jobs[0].id).args == [4]


@pytest.mark.parametrize(("options", "message"), [
    ({"replace": True}, "replace needs key="),
    ({"debounce": "5s"}, "debounce needs key="),
    ({"key_scope": "queued"}, "key_scope needs key="),
    ({"key": "k", "debounce": "5s", "delay": "1s"}, "give debounce or delay / run_at"),
    ({"key": "k", "debounce": "5s", "run_at": 0}, "give debounce or delay / run_at"),
    ({"key": "k", "debounce": 0}, "debounce must be more than 0"),
    ({"key": "k", "debounce": True}, "debounce must be a duration"),
    ({"key": "k", "debounce": "soon"}, "debounce"),
    ({"key": "k", "key_scope": "forever"}, "key_scope must be one of 'live', 'queued'"),
    ({"key": "k", "replace": "yes"}, "replace must be True or False"),
])
def test_bad_options_are_refused_naming_them(queue, options, message):
    with pytest.raises(PayloadError, match=message):
        queue.enqueue("t", **options)
    assert queue.stats()["pending"] == 0


@pytest.mark.parametrize("option", [{"replace": True}, {"debounce": "1s"},
                                    {"key_scope": "queued"}])
def test_batches_and_handlers_cannot_replace(queue, option):
    with pytest.raises(PayloadError, match="cannot be set on a batch member"):
        queue.batch([{"task": "t", **option}])
    with pytest.raises(PayloadError, match="cannot be set on a batch callback"):
        queue.batch([{"task": "t"}], on_complete={"task": "cb", **option})
    ctx = JobContext(id="j1", queue=queue.name, task="t")
    with pytest.raises(PayloadError, match="is for producers"):
        ctx.enqueue("t", **option, key="k")


def test_a_lifo_holder_due_again_goes_to_the_head_of_its_priority(queue):
    first = queue.enqueue("t", 1)
    held = queue.enqueue("t", 2, key="k", lifo=True, delay="1h")
    queue.enqueue("t", 3, key="k", replace=True, delay=0)  # due now: pending, lifo
    assert queue.redis.zrange(queue.keys.pending, 0, -1) == [held.id, first.id]
