"""Results that flow (issue 29, item 2): a dependent and a batch's callback read their
parents' results through their supervisor (`current().parents()`,
`parent_results()`), fenced by the lease, page by page, through real supervisors."""

from __future__ import annotations

import json
import socket
import threading
from types import SimpleNamespace

import pytest

from forq import Queue
from forq.channel import PARENTS_PAGE, PARENTS_PAGE_BYTES
from forq.supervisor.children.answers import Answers
from forq.supervisor.children.reader import MessageReader
from forq.supervisor.leases.calls import leasing
from forq.supervisor.loop.eventloop import EventLoop
from forq.supervisor.redis_io.parents import ParentReads
from forq.testing.redis import delete_queue
from tests.helpers import wait_job
from tests.supervisors import TEST_IMPORTS, SupervisorProcess, write_config

pytestmark = pytest.mark.timeout(120)

IMPORTS = (*TEST_IMPORTS, "tests.control_tasks")


@pytest.fixture
def other(r, queue_name):
    yield Queue(queue_name + "-other", redis=r)
    delete_queue(r, queue_name + "-other")


@pytest.fixture
def sup(tmp_path, redis_url, queue, other):
    """One supervisor serving `queue` and `other`."""
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2, other.name: 1},
                          imports=IMPORTS)
    proc = SupervisorProcess(config).start()
    yield proc
    proc.stop()


def test_a_dependent_reads_its_parents_results_and_why_one_failed(sup, queue):
    ok = queue.enqueue("control.mark", "/dev/null", {"rows": 3})
    failed = queue.enqueue("tests.fail", max_attempts=1)
    child = queue.enqueue("control.parents", depends_on=[ok, failed], allow_failure=True)
    done = wait_job(queue, child.id, ("succeeded", "dead"), context=sup.log)
    assert done.state == "succeeded", (done.history, sup.log()[-2000:])
    assert done.result["results"] == {ok.id: {"rows": 3}}
    (first, second) = done.result["parents"]
    assert first == [ok.id, queue.name, "succeeded", {"rows": 3}, ""]
    assert second[:4] == [failed.id, queue.name, "dead", None]
    assert "attempts exhausted" in second[4], second
    assert "Traceback" not in sup.log()


def test_a_batch_callback_reads_every_members_result_on_any_queue(sup, queue, other):
    batch = queue.batch([{"task": "control.mark", "args": ["/dev/null", i]} for i in range(3)]
                        + [{"task": "control.mark", "args": ["/dev/null", "far"],
                            "queue": other.name}],
                        on_complete="control.parents", on_success="control.async_parents")
    member_ids = batch.member_ids
    callbacks = batch.status().callbacks
    done = wait_job(queue, callbacks["on_complete"], ("succeeded", "dead"), context=sup.log)
    assert done.state == "succeeded", done.history
    assert done.result["results"] == dict(zip(member_ids, [0, 1, 2, "far"], strict=True))
    assert [p[1] for p in done.result["parents"]] == [queue.name] * 3 + [other.name]
    assert [r.result for r in batch.results()] == [0, 1, 2, "far"]  # the producer's view
    asynced = wait_job(queue, callbacks["on_success"], ("succeeded", "dead"), context=sup.log)
    assert asynced.result == {"results": done.result["results"],
                              "states": ["succeeded"] * 4}


def succeed_here(queue: Queue, results: list[object], **options: object) -> list[str]:
    """Jobs that succeeded with `results`, run by this test (claim and ack), not by a
    supervisor: hundreds of parents in a moment."""
    jobs = queue.enqueue_many([{"task": "x.y", **options} for _ in results])
    calls = leasing(queue)
    leases = {lease.id: lease for lease in calls.claim("here", len(results), 60_000).leases}
    assert calls.ack_many([(job.id, leases[job.id].token, json.dumps(result), [])
                           for job, result in zip(jobs, results, strict=True)]) == \
        ["ok"] * len(results)
    return [job.id for job in jobs]


def test_parents_come_in_pages_capped_in_count_and_bytes(tmp_path, redis_url, queue, other):
    """More parents than a page holds, and results bigger than a socket holds: read
    whole, a page at a time; a result over a page's bytes comes alone."""
    sizes = [PARENTS_PAGE_BYTES * 7 // 10, PARENTS_PAGE_BYTES + 10] + [1] * (PARENTS_PAGE + 20)
    parents = succeed_here(queue, ["x" * n for n in sizes])
    child = queue.enqueue("control.parent_sizes", depends_on=parents)
    # across queues too: a batch whose members are on another queue
    members = succeed_here(other, ["y" * (PARENTS_PAGE_BYTES // 2)] * 3)
    queue.redis.rpush(queue.keys.batch("b") + ":members",
                      *(json.dumps([other.name, m]) for m in members))
    callback = queue.enqueue("control.parent_sizes", job_id="b-on_complete")
    queue.redis.hset(queue.keys.job(callback.id), "callback_of", "b")
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2}, imports=IMPORTS)
    sup = SupervisorProcess(config).start()
    try:
        done = wait_job(queue, child.id, ("succeeded", "dead"), timeout=60, context=sup.log)
        assert done.state == "succeeded", done.history
        assert list(done.result) == parents
        assert list(done.result.values()) == [n + 2 for n in sizes]  # with their quotes
        done = wait_job(queue, callback.id, ("succeeded", "dead"), timeout=60, context=sup.log)
        assert done.state == "succeeded", done.history
        assert done.result == {m: PARENTS_PAGE_BYTES // 2 + 2 for m in members}
    finally:
        sup.stop()
    assert "Traceback" not in sup.log()


def test_a_parent_whose_record_is_gone_reads_as_expired(sup, queue):
    gone = queue.enqueue("control.mark", "/dev/null", "kept nowhere", result_ttl=0)
    child = queue.enqueue("control.parents", depends_on=[gone])
    done = wait_job(queue, child.id, ("succeeded", "dead"), context=sup.log)
    assert done.result == {"results": {},
                           "parents": [[gone.id, queue.name, "expired", None, ""]]}


def test_a_child_that_never_reads_its_answer_costs_one_page_until_its_end(sup, queue):
    parents = [job.id for job in queue.enqueue_many(
        [{"task": "control.blob", "args": [PARENTS_PAGE_BYTES // 2, "z"]}] * 4)]
    job = queue.enqueue("control.ask_and_sleep", 60, depends_on=parents, timeout="2s",
                        max_attempts=1)
    done = wait_job(queue, job.id, ("dead",), context=sup.log)
    assert done.reason.startswith("timeout after"), done.reason
    after = queue.enqueue("control.parent_sizes", depends_on=parents)
    assert after.wait(timeout=20) == {p: PARENTS_PAGE_BYTES // 2 + 3 for p in parents}
    assert "Traceback" not in sup.log()


def test_a_job_without_parents_reads_none(sup, queue):
    assert queue.enqueue("control.parents").wait(timeout=20) == {"results": {}, "parents": []}


# -- in Lua, and what a child may ask ---------------------------------------------------


def test_the_read_is_fenced_by_the_lease_and_a_gone_batch_is_said(queue):
    parent = queue.enqueue("x.y")
    child = queue.enqueue("x.z", depends_on=[parent])
    calls = leasing(queue)
    lease = calls.claim("me", 1, 60_000).leases[0]
    assert calls.ack(lease.id, lease.token, '{"n":1}') == "ok"
    lease = calls.claim("me", 1, 60_000).leases[0]
    assert lease.id == child.id
    assert calls.read_parents(child.id, "stale", 0, 10, 1000).status == "lost"
    page = calls.read_parents(child.id, lease.token, 0, 10, 1000)
    assert page == (page.status, 1, -1, [[queue.name, parent.id, "succeeded", '{"n":1}', ""]])
    # a callback whose batch's record is gone
    queue.redis.hset(queue.keys.job(child.id), mapping={"callback_of": "nope"})
    queue.redis.hdel(queue.keys.job(child.id), "depends_on")
    assert calls.read_parents(child.id, lease.token, 0, 10, 1000).status == "expired"


def test_the_parent_serves_one_request_at_a_time_and_each_page_once():
    reader = MessageReader("j1", 1 << 20)
    reader.feed(b'{"t": "parents"}\n')
    assert reader.parents_open and not reader.violation
    reader.feed(b'{"t": "parents"}\n')  # before the answer was written
    assert reader.violation == "asked for its parents before its previous request was answered"
    reader = MessageReader("j1", 1 << 20)
    reader.feed(b'{"t": "parents"}\n')
    reader.parents_answered(-1)  # the last page
    reader.feed(b'{"t": "parents"}\n')
    assert reader.violation == "asked for its parents again after the last page"
    reader = MessageReader("j1", 1 << 20)
    reader.feed(b'{"t": "parents", "queue": "another"}\n')
    assert reader.violation == "parents has unknown field(s) queue"
    reader = MessageReader("j1", 1 << 20)
    reader.feed(b'{"t": "parents"}\n{"t": "step", "name": "a", "result": 1}\n')
    assert reader.violation == "sent a step before its request for parents was answered"


def test_pages_are_cut_at_their_caps_and_written_as_the_child_reads(queue, other):
    """ParentReads in process, a socketpair for the child's channel: each page holds at
    most PARENTS_PAGE parents and PARENTS_PAGE_BYTES (or one parent), on this queue and
    on another, and a page larger than the socket holds is written as it is read."""
    big = PARENTS_PAGE_BYTES * 6 // 10
    here = succeed_here(queue, ["x" * big] * 2 + [1] * (PARENTS_PAGE + 1))
    far = succeed_here(other, ["y" * big] * 2)
    queue.redis.rpush(queue.keys.batch("b") + ":members",
                      *(json.dumps([q, m]) for q, m in [(queue.name, here[0]),
                                                        (other.name, far[0]),
                                                        (other.name, far[1])]))
    dependent = queue.enqueue("x.z", depends_on=here)
    callback = queue.enqueue("x.z", job_id="b-on_complete")
    queue.redis.hset(queue.keys.job(callback.id), "callback_of", "b")
    leases = {lease.id: lease for lease in leasing(queue).claim("me", 10, 60_000).leases}
    loop = EventLoop()
    reads = ParentReads(lambda name: queue if name == queue.name else other, Answers(loop))

    def pages_of(job_id: str) -> list[list[list[str]]]:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        lines: list[bytes] = []
        listener = threading.Thread(target=lambda: lines.extend(theirs.makefile("rb")))
        listener.start()
        child = SimpleNamespace(job_id=job_id, queue=queue.name, task="x.z", pipe=ours.fileno(),
                                lease=leases[job_id], reader=MessageReader(job_id, 1 << 20),
                                stop=lambda *a, **k: pytest.fail("stopped"))
        pages = []
        while child.reader.parents_next >= 0:
            child.reader.feed(b'{"t": "parents"}\n')
            reads.heard(child)
            while child.reader.parents_open:
                if reads.waiting:
                    pipe = queue.redis.pipeline(transaction=False)
                    sent = reads.send(pipe, lambda _id: leases[job_id].token)
                    reads.answered(sent, pipe.execute())
                loop.run_once(cap=0.01)
            pages.append(len(lines))
        loop.remove_reader(ours)
        ours.close()
        listener.join(timeout=10)
        theirs.close()
        return [json.loads(line)["parents"] for line in lines]

    pages = pages_of(dependent.id)
    assert [len(p) for p in pages] == [1, 1 + PARENTS_PAGE - 1, 2]  # bytes, then count
    assert [e[1] for page in pages for e in page] == here
    pages = pages_of(callback.id)
    # 0.6 + 0.6 MiB is over a page: each alone, the local one read by the script, the
    # others from their own queue's slot
    assert [[e[1] for e in page] for page in pages] == [[here[0]], [far[0]], [far[1]]]
    assert pages[1][0] == [other.name, far[0], "succeeded", json.dumps("y" * big), ""]
    loop.close()


def test_a_rerun_asks_while_an_earlier_runs_answer_is_still_unwritten(queue):
    """The first run's child ended before reading its page (its answer still waiting to
    be written); the job's next run on the same supervisor is answered all the same."""
    [parent] = succeed_here(queue, ["p" * (PARENTS_PAGE_BYTES // 2)])
    job = queue.enqueue("x.z", depends_on=[parent])
    (lease,) = leasing(queue).claim("me", 1, 60_000).leases
    loop = EventLoop()
    reads = ParentReads(lambda name: queue, Answers(loop))

    def child(pipe: int) -> SimpleNamespace:
        reader = MessageReader(job.id, 1 << 20)
        reader.feed(b'{"t": "parents"}\n')
        return SimpleNamespace(job_id=job.id, queue=queue.name, task="x.z", pipe=pipe,
                               lease=lease, reader=reader, stop=lambda *a, **k: None)

    def serve(runs: int = 3) -> None:
        for _ in range(runs):
            pipe = queue.redis.pipeline(transaction=False)
            sent = reads.send(pipe, lambda _id: lease.token)
            reads.answered(sent, pipe.execute())

    first_ours, first_theirs = socket.socketpair()
    first_ours.setblocking(False)
    first = child(first_ours.fileno())
    reads.heard(first)
    serve(1)  # the page does not fit its socket: part of it waits to be written
    assert reads.answers.unsent and first.reader.parents_open
    first.pipe = -1  # it ended (Children.ended closes its channel)
    loop.remove_reader(first_ours)
    first_ours.close()
    first_theirs.close()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    lines: list[bytes] = []
    listener = threading.Thread(target=lambda: lines.extend(theirs.makefile("rb")))
    listener.start()
    second = child(ours.fileno())
    reads.heard(second)
    serve(1)
    while second.reader.parents_open:
        loop.run_once(cap=0.01)
    loop.remove_reader(ours)
    ours.close()
    listener.join(timeout=10)
    theirs.close()
    loop.close()
    assert [e[1] for e in json.loads(lines[0])["parents"]] == [parent]
