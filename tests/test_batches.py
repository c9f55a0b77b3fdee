"""Batches (fan-out / fan-in) and dependencies (depends_on), against a real Redis.

The first part drives the transitions directly (claim, ack, fail, reclaim, cancel) to
pin down when a batch's callbacks are enqueued: exactly once, atomically with the end
of its last member. The second runs real supervisors: a fan-out of 1,000 jobs with
crashing members and a supervisor SIGKILLed in the middle, a batch opened from a
handler inside a batch, members on another queue (the relay), and dependencies.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forq import JobNotFound, PayloadError, Queue
from forq.store import transitions as tr
from forq.supervisor.leases.calls import leasing
from forq.testing.redis import delete_queue
from tests.helpers import wait_for, wait_job
from tests.supervisors import TEST_IMPORTS, SupervisorProcess, write_config

IMPORTS = (*TEST_IMPORTS, "tests.batch_tasks")
TERMINAL = ("succeeded", "dead", "cancelled")


@pytest.fixture
def other(r: Any) -> Iterator[Queue]:
    name = "t" + uuid.uuid4().hex[:12]
    yield Queue(name, redis=r)
    delete_queue(r, name)


def run_all(q: Queue, outcome: Any = lambda lease: "ok") -> list[str]:
    """Claim everything pending in `q` and end each job as `outcome(lease)` says:
    "ok" (ack), "fatal" (dead), "retry" (a failed attempt). Returns the ids claimed."""
    ids = []
    while True:
        claim = leasing(q).claim("test-sup", 50, 30000)
        if not claim.leases:
            return ids
        for lease in claim.leases:
            ids.append(lease.id)
            how = outcome(lease)
            if how == "ok":
                assert leasing(q).ack(lease.id, lease.token, json.dumps(lease.id)) == "ok"
            else:
                leasing(q).fail(lease.id, lease.token, {"message": "no"}, how)


def callbacks_of(q: Queue, batch_id: str) -> set[str]:
    """Which of the batch's callback jobs exist (whatever their state)."""
    return {name for name in ("on_success", "on_complete")
            if q.redis.exists(q.keys.job(f"{batch_id}-{name}"))}


# -- the transitions ---------------------------------------------------------------------


def test_on_success_and_on_complete_when_every_member_succeeds(queue):
    batch = queue.batch([{"task": "t", "args": [i]} for i in range(5)],
                        on_success="cb.ok", on_complete={"task": "cb.done", "kwargs": {"x": 1}})
    assert batch.status().state == "open"
    claim = leasing(queue).claim("test-sup", 10, 30000)
    assert sorted(lease.id for lease in claim.leases) == sorted(batch.member_ids)
    for lease in claim.leases[:-1]:
        leasing(queue).ack(lease.id, lease.token, "1")
        assert callbacks_of(queue, batch.id) == set()  # not before the last member ends
    last = claim.leases[-1]
    leasing(queue).ack(last.id, last.token, "2")
    assert callbacks_of(queue, batch.id) == {"on_success", "on_complete"}
    done = queue.get(f"{batch.id}-on_complete")
    assert done.kwargs == {"x": 1, "batch_id": batch.id}
    assert queue.get(f"{batch.id}-on_success").kwargs == {"batch_id": batch.id}
    # enqueued in the same step as the last ack: the same Redis time
    assert done.fields["enqueued_at"] == queue.get(last.id).fields["finished_at"]
    status = batch.status()
    assert (status.state, status.total, status.ended, status.failed) == ("succeeded", 5, 5, 0)
    assert [m.result for m in batch.results()] == [1, 1, 1, 1, 2]


def test_a_dead_member_gets_on_complete_only(queue):
    batch = queue.batch([{"task": "t"}, {"task": "t"}], on_success="cb.ok", on_complete="cb.done")
    run_all(queue, lambda lease: "fatal" if lease.id == batch.member_ids[0] else "ok")
    assert callbacks_of(queue, batch.id) == {"on_complete"}
    status = batch.status()
    assert (status.state, status.failed) == ("failed", 1)
    assert [m.state for m in batch.results()] == ["dead", "succeeded"]


def test_a_retried_member_counts_only_when_it_ends(queue):
    batch = queue.batch([{"task": "t", "max_attempts": 3}], on_complete="cb.done")
    tries = []

    def twice_then_ok(lease: tr.Lease) -> str:
        if lease.id in batch.member_ids:
            tries.append(lease.id)
        return "retry" if len(tries) < 3 else "ok"

    for _ in range(3):
        queue.redis.zadd(queue.keys.scheduled, {batch.member_ids[0]: 0}, xx=True)  # due now
        run_all(queue, twice_then_ok)
        assert (callbacks_of(queue, batch.id) == set()) == (len(tries) < 3)
    assert len(tries) == 3
    assert callbacks_of(queue, batch.id) == {"on_complete"}


def test_crashes_count_when_the_reclaim_sends_the_member_to_dead(queue):
    batch = queue.batch([{"task": "t", "max_crashes": 2}], on_complete="cb.done")
    for crash in range(2):
        lease = leasing(queue).claim("test-sup", 1, 30000).leases[0]
        leasing(queue).expire(lease.id, lease.token, "killed by SIGKILL")
        moved = leasing(queue).reclaim("test-sup")
        assert moved.ids == [lease.id]
        assert (callbacks_of(queue, batch.id) == set()) == (crash == 0)
    assert queue.get(batch.member_ids[0]).state == "dead"
    assert callbacks_of(queue, batch.id) == {"on_complete"}


def test_cancelled_members_end_the_batch_and_a_requeued_one_never_counts_twice(queue):
    batch = queue.batch([{"task": "t"}, {"task": "t"}], on_complete="cb.done")
    first, second = batch.member_ids
    assert queue.cancel(first) == "cancelled"
    assert callbacks_of(queue, batch.id) == set()
    run_all(queue, lambda lease: "fatal")
    assert callbacks_of(queue, batch.id) == {"on_complete"}
    assert queue.get(second).state == "dead"
    queue.redis.delete(queue.keys.job(f"{batch.id}-on_complete"))  # would it come again?
    assert queue.requeue_dead([second])[0] == 1
    run_all(queue, lambda lease: "ok" if lease.id == second else "fatal")
    assert queue.get(second).state == "succeeded"
    assert callbacks_of(queue, batch.id) == set()  # counted once: no second callback
    assert batch.status().ended == 2


def test_opening_the_same_batch_again_adds_nothing(queue):
    jobs = [{"task": "t"} for _ in range(3)]
    first = queue.batch(jobs, on_complete="cb.done", batch_id="b-fixed")
    again = queue.batch(jobs, on_complete="cb.done", batch_id="b-fixed")
    assert first.member_ids == again.member_ids
    assert queue.redis.zcard(queue.keys.pending) == 3
    assert queue.get_batch("b-fixed").id == "b-fixed"
    with pytest.raises(JobNotFound, match="no batch nope in queue"):
        queue.get_batch("nope")


def test_a_member_on_another_queue_reaches_its_batch_through_the_relay(queue, other):
    batch = queue.batch([{"task": "t"}, {"task": "t", "queue": other.name}],
                        on_success="cb.ok")
    run_all(queue)
    run_all(other)
    # its end waits in its own queue's relay: no script wrote the batch's slot
    assert callbacks_of(queue, batch.id) == set()
    (entry,) = other.redis.zrange(other.keys.relay, 0, -1)
    assert json.loads(entry) == [queue.name, batch.id, batch.member_ids[1], 1]
    ends = [(batch.id, batch.member_ids[1], True)]
    relay = tr.batch_relay_call(queue.keys, ends)
    assert tr.parse_batch_relay(queue.scripts.run(relay)) == 1
    assert tr.parse_batch_relay(queue.scripts.run(relay)) == 0  # delivered twice: counted once
    assert callbacks_of(queue, batch.id) == {"on_success"}
    assert [(m.queue, m.state) for m in batch.results()] == [
        (queue.name, "succeeded"), (other.name, "succeeded")]


def test_bad_batches_are_refused_naming_the_argument(queue):
    with pytest.raises(PayloadError, match="batch: jobs is empty"):
        queue.batch([], on_complete="cb")
    with pytest.raises(PayloadError, match=r"^on_success must be a task name or a mapping"):
        queue.batch([{"task": "t"}], on_success=42)
    with pytest.raises(PayloadError, match=r"^on_complete: task name must be a non-empty"):
        queue.batch([{"task": "t"}], on_complete={"kwargs": {}})
    with pytest.raises(PayloadError, match=r"on_success: kwargs\['batch_id'\] is set by forq"):
        queue.batch([{"task": "t"}], on_success={"task": "cb", "kwargs": {"batch_id": 1}})
    with pytest.raises(PayloadError, match=r"^jobs\[1\]: key cannot be set on a batch member"):
        queue.batch([{"task": "t"}, {"task": "t", "key": "k"}])
    with pytest.raises(PayloadError, match=r"^jobs\[0\]: queue name"):
        queue.batch([{"task": "t", "queue": "a:b"}])
    with pytest.raises(PayloadError, match=r"^jobs\[0\]: task 't': unknown option"):
        queue.batch([{"task": "t", "bogus": 1}])
    assert queue.redis.zcard(queue.keys.pending) == 0


# -- depends_on ---------------------------------------------------------------------------


def test_a_job_waits_for_its_parents_and_runs_once_they_all_succeeded(queue):
    a, b = queue.enqueue("t"), queue.enqueue("t")
    child = queue.enqueue("t", depends_on=[a, b.id], keep_history=True)
    assert child.fields["enqueue_status"] == "waiting"
    job = queue.get(child.id)
    assert (job.state, job.fields["waiting_on"], json.loads(job.fields["depends_on"])) == (
        "waiting", "2", [a.id, b.id])
    assert queue.stats()["waiting"] == 1
    ran = run_all(queue, lambda lease: "ok")
    assert ran[:2] == [a.id, b.id] and child.id in ran  # released by b's ack, then claimed
    assert queue.get(child.id).state == "succeeded"
    assert "dependency ended" in [e["event"] for e in queue.get(child.id).history]


def test_a_dead_parent_sends_its_dependents_to_dead_and_they_theirs(queue):
    parent = queue.enqueue("t")
    child = queue.enqueue("t", depends_on=[parent])
    grandchild = queue.enqueue("t", depends_on=[child])
    run_all(queue, lambda lease: "fatal")
    assert queue.get(child.id).state == "dead"
    assert queue.get(child.id).reason == f"dependency {parent.id} failed"
    assert queue.get(grandchild.id).reason == f"dependency {child.id} failed"
    assert queue.stats()["waiting"] == 0


def test_allow_failure_releases_it_anyway(queue):
    parent = queue.enqueue("t")
    child = queue.enqueue("t", depends_on=[parent], allow_failure=True)
    run_all(queue, lambda lease: "fatal" if lease.id == parent.id else "ok")
    assert queue.get(child.id).state == "succeeded"


def test_parents_that_ended_before_the_enqueue(queue):
    done, dead = queue.enqueue("t"), queue.enqueue("t")
    run_all(queue, lambda lease: "ok" if lease.id == done.id else "fatal")
    assert queue.enqueue("t", depends_on=[done]).fields["enqueue_status"] == "pending"
    late = queue.enqueue("t", depends_on=[done, dead])
    assert late.fields["enqueue_status"] == "dead"
    assert queue.get(late.id).reason == f"dependency {dead.id} failed"
    assert queue.enqueue("t", depends_on=[dead], allow_failure=True
                         ).fields["enqueue_status"] == "pending"


def test_a_waiting_job_can_be_cancelled_and_its_delay_still_holds(queue):
    parent = queue.enqueue("t")
    cancelled = queue.enqueue("t", depends_on=[parent])
    delayed = queue.enqueue("t", depends_on=[parent], delay="1h")
    assert queue.cancel(cancelled.id) == "cancelled"
    run_all(queue)
    assert queue.get(cancelled.id).state == "cancelled"
    assert queue.get(delayed.id).state == "scheduled"


def test_bad_dependencies_are_refused_and_nothing_is_written(queue, other):
    known = queue.enqueue("t")
    with pytest.raises(PayloadError, match=r"depends_on of job .*: no job nope in queue"):
        queue.enqueue_many([{"task": "t"}, {"task": "t", "depends_on": [known.id, "nope"]}])
    elsewhere = other.enqueue("t")
    with pytest.raises(PayloadError, match=f"no job {elsewhere.id} in queue {queue.name}"):
        queue.enqueue("t", depends_on=[elsewhere])
    # a new client's first enqueue registers the queue in the same pipeline
    fresh = Queue(queue.name, redis=queue.redis)
    with pytest.raises(PayloadError, match=r"^depends_on of job .*: no job nope in queue"):
        fresh.enqueue("t", depends_on=["nope"])
    with pytest.raises(PayloadError, match="depends_on must be a list of job ids"):
        queue.enqueue("t", depends_on=known.id)
    with pytest.raises(PayloadError, match="depends_on is empty"):
        queue.enqueue("t", depends_on=[])
    with pytest.raises(PayloadError, match="allow_failure needs depends_on"):
        queue.enqueue("t", allow_failure=True)
    assert queue.stats()["pending"] == 1  # only `known`
    # a parent enqueued earlier in the same call is known
    first, second = queue.enqueue_many([{"task": "t", "job_id": "p1"},
                                        {"task": "t", "depends_on": ["p1"]}])
    assert second.fields["enqueue_status"] == "waiting"


# -- real supervisors ------------------------------------------------------------------


def start_supervisor(tmp_path: Path, redis_url: str, queues: dict[str, int],
                     name: str = "sup", **options: Any) -> SupervisorProcess:
    config = write_config(tmp_path / f"{name}.toml", redis_url, queues, imports=IMPORTS,
                          drain_timeout="1s", **options)
    return SupervisorProcess(config).start()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.timeout(400)
def test_a_fan_out_of_1000_with_crashes_and_a_killed_supervisor_calls_back_once(
        tmp_path, redis_url, queue):
    """1,000 members: some exit without a result every time (dead after max_crashes),
    some SIGKILL themselves once, some fail; the supervisor running them is SIGKILLed
    in the middle, a second one takes over. The callback runs once, after all ended."""
    calls = tmp_path / "callbacks"
    modes = ["ok"] * 1000
    for i in range(0, 1000, 50):
        modes[i] = "crash"
    for i in range(7, 1000, 40):
        modes[i] = "kill_once"
    for i in range(13, 1000, 100):
        modes[i] = "fail"
    for i in range(21, 1000, 60):
        modes[i] = "crash_once"
    callback = {"task": "batch.callback", "kwargs": {"path": str(calls)}}
    batch = queue.batch([{"task": "batch.work", "args": [i, mode]} for i, mode in enumerate(modes)],
                        on_success={**callback, "kwargs": {"path": str(calls), "kind": "success"}},
                        on_complete={**callback, "kwargs": {"path": str(calls), "kind": "complete"}})
    first = start_supervisor(tmp_path, redis_url, {queue.name: 8}, name="first", max_crashes=2)
    try:
        wait_for(lambda: batch.status().ended >= 300, timeout=120,
                 message="300 members to end under the first supervisor")
        first.kill()
    finally:
        first.kill()
    assert batch.status().ended < 1000
    with start_supervisor(tmp_path, redis_url, {queue.name: 8}, name="second", max_crashes=2):
        wait_for(lambda: "complete" in " ".join(lines(calls)), timeout=180,
                 message="the on_complete callback to run")
        done = wait_job(queue, f"{batch.id}-on_complete", TERMINAL, timeout=30)
    assert lines(calls) == [f"{batch.id} complete"]  # once, and no on_success: some failed
    assert done.state == "succeeded"
    status = batch.status()
    assert (status.state, status.total, status.ended) == ("failed", 1000, 1000)
    members = batch.results()
    assert all(m.state in TERMINAL for m in members)
    assert {m.state for i, m in enumerate(members) if modes[i] in ("crash", "fail")} == {"dead"}
    assert {m.state for i, m in enumerate(members) if modes[i] not in ("crash", "fail")} == {
        "succeeded"}
    assert status.failed == sum(mode in ("crash", "fail") for mode in modes)
    # after all members ended: enqueued in the step that ended the last one
    last_end = max(int(queue.get(m.id).fields["finished_at"]) for m in members)
    assert int(done.fields["enqueued_at"]) == last_end
    with pytest.raises(JobNotFound):
        queue.get(f"{batch.id}-on_success")


def test_a_batch_opened_by_a_member_ends_that_member_when_it_is_done(
        tmp_path, redis_url, queue, other):
    """Nested, across queues: a member of the outer batch opens an inner one from its
    handler, half on another queue; the outer callback runs after the inner one's
    members all ended, each callback once; a failing inner member fails both."""
    calls = tmp_path / "calls"
    outer = queue.batch(
        [{"task": "batch.open", "args": [6, str(calls), other.name, 3]},
         {"task": "batch.work", "args": [0, "ok", str(calls)]}],
        on_success={"task": "batch.callback", "kwargs": {"path": str(calls), "kind": "outer-ok"}},
        on_complete={"task": "batch.callback", "kwargs": {"path": str(calls), "kind": "outer"}})
    opener = outer.member_ids[0]
    with start_supervisor(tmp_path, redis_url, {queue.name: 4, other.name: 4}):
        wait_for(lambda: {"inner", "outer"} <= {line.split()[-1] for line in lines(calls)},
                 timeout=60, message="both callbacks")
        wait_job(queue, f"{outer.id}-on_complete", TERMINAL)
    inner = queue.get_batch(f"{opener}-b")
    status = inner.status()
    assert (status.state, status.total, status.ended, status.failed) == ("failed", 6, 6, 1)
    assert (status.opener, status.parent_batch) == (opener, outer.id)
    assert [m.queue for m in inner.results()] == [queue.name, other.name] * 3
    assert other.get(inner.results()[1].id).fields["parent"] == opener
    callbacks = [line for line in lines(calls) if line.split()[-1] in ("inner", "outer", "outer-ok")]
    assert sorted(callbacks) == sorted([f"{inner.id} inner", f"{outer.id} outer"])  # each once
    # the outer one was enqueued with (or after) the inner one: its member ended then
    assert (int(queue.get(f"{inner.id}-on_complete").fields["enqueued_at"])
            <= int(queue.get(f"{outer.id}-on_complete").fields["enqueued_at"]))
    assert outer.status().failed == 1  # the opener counts as failed: its batch failed
    inner_done = max(int(Queue(m.queue, redis=queue.redis).get(m.id).fields["finished_at"])
                     for m in inner.results())
    assert int(queue.get(f"{outer.id}-on_complete").fields["enqueued_at"]) >= inner_done


def test_dependencies_under_a_supervisor(tmp_path, redis_url, queue):
    calls = tmp_path / "calls"
    first = queue.enqueue("batch.work", 1, "ok", str(calls))
    then = queue.enqueue("batch.work", 2, "ok", str(calls), depends_on=[first])
    broken = queue.enqueue("batch.work", 3, "fail", str(calls))
    never = queue.enqueue("batch.work", 4, "ok", str(calls), depends_on=[broken, then])
    anyway = queue.enqueue("batch.work", 5, "ok", str(calls), depends_on=[broken],
                           allow_failure=True)
    with start_supervisor(tmp_path, redis_url, {queue.name: 4}):
        for job in (then, never, anyway):
            wait_job(queue, job.id, TERMINAL)
    assert queue.get(then.id).state == "succeeded"
    assert queue.get(never.id).reason == f"dependency {broken.id} failed"
    assert queue.get(anyway.id).state == "succeeded"
    ran = [line.split()[0] for line in lines(calls)]
    assert never.id not in ran
    assert ran.index(first.id) < ran.index(then.id)


def forq_cli(redis_url: str, *args: str) -> Any:
    import subprocess
    import sys

    from tests.supervisors import REPO
    return subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url, *args],
                          capture_output=True, text=True, timeout=60, cwd=str(REPO))


def test_forq_batch_and_forq_job_show_batches_and_parents(redis_url, queue, other):
    batch = queue.batch([{"task": "t", "args": [1]}, {"task": "t", "queue": other.name}],
                        on_complete="cb.done")
    run_all(queue)
    parent = queue.enqueue("t")
    child = queue.enqueue("t", depends_on=[parent], allow_failure=True)
    shown = forq_cli(redis_url, "batch", batch.id)
    assert shown.returncode == 0, shown.stderr
    assert "state     open    1 of 2 ended, 0 failed" in shown.stdout
    assert f"{batch.member_ids[0]}  succeeded  {batch.member_ids[0]}" in shown.stdout
    assert f"{batch.member_ids[1]} ({other.name})  pending" in shown.stdout
    data = json.loads(forq_cli(redis_url, "batch", batch.id, "--json", "-q", queue.name).stdout)
    assert [m["state"] for m in data["members"]] == ["succeeded", "pending"]
    assert data["callbacks"] == {"on_complete": f"{batch.id}-on_complete"}
    missing = forq_cli(redis_url, "batch", "nope")
    assert missing.returncode == 1 and "no batch nope in any queue" in missing.stderr
    assert "Traceback" not in missing.stderr
    job = forq_cli(redis_url, "job", child.id)
    assert f"parents   {parent.id}    waiting on 1    (allow_failure)" in job.stdout
    record = json.loads(forq_cli(redis_url, "job", child.id, "--json").stdout)
    assert (record["state"], record["depends_on"], record["waiting_on"]) == (
        "waiting", [parent.id], 1)
    member = json.loads(forq_cli(redis_url, "job", batch.member_ids[1], "--json").stdout)
    assert (member["batch"], member["batch_queue"]) == (batch.id, queue.name)
