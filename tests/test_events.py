"""The queue's event stream, written by the transition scripts themselves (lua/includes/
events.lua), read by `Queue.events` / `AsyncQueue.events`, blocked on by `job.wait`; the
per-queue switch and cap; the on_dead job a death enqueues. Scripts driven directly
against a real Redis (the supervisor's lease calls); tests/test_events_supervisor.py
runs real supervisors."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest

from forq import AsyncQueue, JobFailed, JobTimeout, Queue
from forq.store import events as queue_events
from forq.store.events import KINDS, EventReader, QueueEvent
from forq.store.pipelines import send
from forq.store.scripts import source
from forq.store.transitions import TRANSITIONS
from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for

SUP = "host-a:100"


def kinds(queue: Queue, job_id: str | None = None) -> list[str]:
    return [e.kind for e in queue.events() if job_id is None or e.job_id == job_id]


def claim_one(queue: Queue, owner: str = SUP):
    (lease,) = leasing(queue).claim(owner, 1, 60_000).leases
    return lease


# -- what each transition writes ------------------------------------------------------------


def test_a_job_that_succeeds_writes_enqueued_started_progress_succeeded(queue):
    job = queue.enqueue("mail.send", "ada@example.com")
    lease = claim_one(queue)
    assert leasing(queue).record_progress([(job.id, lease.token, 0.5, "half way")]) == ["ok"]
    assert leasing(queue).ack(job.id, lease.token, '"sent"') == "ok"
    events = list(queue.events())
    assert [e.kind for e in events] == ["enqueued", "started", "progress", "succeeded"]
    assert {e.job_id for e in events} == {job.id}
    assert {e.task for e in events} == {"mail.send"}
    assert events[0].fields == {"state": "pending"} and events[0].supervisor is None
    assert [e.supervisor for e in events[1:]] == [SUP] * 3
    assert events[2].fields == {"value": "0.5", "message": "half way"}
    assert all(isinstance(e, QueueEvent) and e.queue == queue.name for e in events)
    stamps = [e.stream_id for e in events]
    assert stamps == sorted(stamps, key=lambda s: tuple(map(int, s.split("-"))))
    redis_now = queue.redis.time()[0]
    assert all(abs(e.at - redis_now) < 60 for e in events)


def test_a_failed_attempt_is_failed_then_retried_and_the_last_failed_then_dead(queue):
    job = queue.enqueue("flaky", max_attempts=2)
    lease = claim_one(queue)
    leasing(queue).fail(job.id, lease.token, {"message": "boom"})
    queue.redis.zadd(queue.keys.scheduled, {job.id: 0})  # due now, not after the backoff
    lease = claim_one(queue)
    leasing(queue).fail(job.id, lease.token, {"message": "boom again"})
    events = list(queue.events())
    assert [e.kind for e in events] == ["enqueued", "started", "failed", "retried",
                                        "started", "failed", "dead"]
    first_fail, retried = events[2], events[3]
    assert (first_fail.reason, first_fail.fields, first_fail.supervisor) == \
        ("boom", {"attempt": "1"}, SUP)
    assert retried.supervisor == SUP and int(retried.fields["run_at"]) > 0
    assert events[-1].reason == "boom again (attempts exhausted: 2)"
    assert events[-1].supervisor == SUP


def test_a_crash_is_failed_then_retried_and_past_max_crashes_dead(queue):
    job = queue.enqueue("crashy", max_crashes=2)
    for _ in range(2):
        lease = claim_one(queue)
        leasing(queue).expire(job.id, lease.token, "killed by SIGKILL")
        leasing(queue).reclaim("reaper:1")
    events = list(queue.events())
    assert [e.kind for e in events] == ["enqueued", "started", "failed", "retried",
                                        "started", "failed", "dead"]
    assert events[2].reason == "killed by SIGKILL" and events[2].fields == {"crashes": "1"}
    assert events[2].supervisor == SUP  # the one it crashed on, not the reaper
    assert events[-1].reason == "killed by SIGKILL (crashes exhausted: 2)"


def test_release_cancel_requeue_and_expiry_write_their_events(queue):
    drained = queue.enqueue("slow")
    lease = claim_one(queue)
    leasing(queue).release(drained.id, lease.token, "drain")
    queue.cancel(drained.id)
    waiting = queue.enqueue("later", delay="1h")
    assert queue.cancel(waiting.id) == "cancelled"
    fatal = queue.enqueue("poison")
    lease = claim_one(queue)
    leasing(queue).fail(fatal.id, lease.token, {"message": "no"}, mode="fatal")
    queue.requeue_dead([fatal.id])
    expiring = queue.enqueue("stale", delay="200ms", expires_in="250ms")
    wait_for(lambda: leasing(queue).sweep_expired("reaper:1") or
             queue.get(expiring.id).state == "dead", timeout=5)
    assert kinds(queue, drained.id) == ["enqueued", "started", "released", "cancelled"]
    assert kinds(queue, waiting.id) == ["enqueued", "cancelled"]
    assert kinds(queue, fatal.id) == ["enqueued", "started", "failed", "dead", "requeued"]
    assert kinds(queue, expiring.id) == ["enqueued", "dead"]
    released = [e for e in queue.events() if e.kind == "released"][0]
    assert (released.reason, released.supervisor) == ("drain", SUP)
    dead = [e for e in queue.events() if e.kind == "dead" and e.job_id == expiring.id][0]
    assert dead.reason == "expired before start"


def test_an_active_job_cancelled_names_its_supervisor(queue):
    job = queue.enqueue("long")
    lease = claim_one(queue)
    assert queue.cancel(job.id) == "cancelling"
    leasing(queue).fail(job.id, lease.token, {"message": "cancelled"}, mode="cancel")
    events = [e for e in queue.events() if e.job_id == job.id]
    assert [e.kind for e in events] == ["enqueued", "started", "cancelled"]
    assert events[-1].supervisor == SUP


def test_dependents_and_callbacks_write_their_own_events(queue):
    parent = queue.enqueue("parent")
    child = queue.enqueue("child", depends_on=[parent.id])
    lease = claim_one(queue)
    leasing(queue).fail(parent.id, lease.token, {"message": "no"}, mode="fatal")
    assert kinds(queue, child.id) == ["enqueued", "dead"]
    assert [e.fields.get("state") for e in queue.events() if e.job_id == child.id] == \
        ["waiting", None]
    dead = [e for e in queue.events() if e.job_id == child.id][-1]
    assert dead.reason == f"dependency {parent.id} failed"


def test_each_scripts_header_names_the_events_it_can_write():
    """A script's ``Events:`` line lists exactly the kinds its code (includes pasted)
    can write, and every kind is one `KINDS` documents."""
    for name in TRANSITIONS:
        text = source(name)
        header = re.search(r"^  Events: (.*)$", text.split("]]", 1)[0], re.MULTILINE)
        declared = set(header.group(1).split(", ")) if header else set()
        body = re.sub(r"--\[\[.*?\]\]", "", text, flags=re.S)
        body = re.sub(r"--[^\n]*", "", body)
        written = set(re.findall(r"emit\(prefix, '(\w+)'", body))
        if re.search(r"\bjob_died\(prefix", body):
            written.add("dead")
        assert declared == written, f"lua/{name}.lua: Events: {sorted(declared)}, writes {sorted(written)}"
        assert written <= set(KINDS), name


# -- the switch and the cap --------------------------------------------------------------------


def test_events_off_writes_nothing_and_frees_the_stream(queue):
    queue.enqueue("a")
    assert queue.redis.exists(queue.keys.events)
    queue.set_events(False)
    assert not queue.redis.exists(queue.keys.events)
    job = queue.enqueue("b")
    lease = claim_one(queue)
    leasing(queue).ack(job.id, lease.token, "1")
    assert not queue.redis.exists(queue.keys.events)
    assert queue.event_settings() == {"events": False, "keep": 0, "on_dead": None}
    queue.set_events(True)
    queue.enqueue("c")
    assert kinds(queue) == ["enqueued"]


def test_the_stream_is_capped_at_about_keep_entries(queue):
    queue.set_events(True, keep=200)
    queue.enqueue_many([{"task": "t"}] * 1000)
    length = queue.redis.xlen(queue.keys.events)
    assert 200 <= length < 400  # MAXLEN ~ trims whole stream nodes (100 entries)
    assert queue.event_settings() == {"events": True, "keep": 200, "on_dead": None}


@pytest.mark.parametrize(("value", "keep"), [("garbage", 10000), ("", 10000), ("-5", 0),
                                             ("1e400", 1_000_000), ("nan", 10000),
                                             ("7.9", 7)])
def test_a_hostile_switch_value_never_breaks_a_transition(queue, value, keep):
    """The scripts and the clients read a switch someone wrote by hand alike."""
    queue.redis.hset(queue.keys.limits, "events", value)
    job = queue.enqueue("t")
    lease = claim_one(queue)
    assert leasing(queue).ack(job.id, lease.token, "1") == "ok"
    assert queue.get(job.id).state == "succeeded"
    assert queue.event_settings()["keep"] == keep
    assert queue.redis.exists(queue.keys.events) == (keep > 0)


@pytest.mark.parametrize("keep", [0, -1, 1_000_001, 2.5, True, "10"])
def test_set_events_refuses_a_bad_keep(queue, keep):
    with pytest.raises(ValueError, match="keep must be an integer from 1 to 1,000,000"):
        queue.set_events(True, keep=keep)


def test_a_long_reason_is_cut_on_a_character_boundary(queue):
    """A handler's error (untrusted) lands in the stream cut to 200 bytes, never in the
    middle of a UTF-8 character: every reply stays decodable."""
    job = queue.enqueue("t")
    lease = claim_one(queue)
    message = "é" * 150 + "€" * 100  # 300 + 300 bytes, 2- and 3-byte characters
    leasing(queue).fail(job.id, lease.token, {"message": message}, mode="fatal")
    for odd in range(1, 4):  # shift the boundary: every cut lands inside a character
        other = queue.enqueue("t")
        lease = claim_one(queue)
        leasing(queue).record_progress([(other.id, lease.token, 0.1, "x" * odd + "€" * 80)])
    events = list(queue.events())  # decoding would raise on a cut character
    dead = [e for e in events if e.kind == "dead"][0]
    assert dead.reason == "é" * 100 and len(dead.reason.encode()) == 200
    for event in events:
        if event.kind == "progress":
            assert len(event.fields["message"].encode()) <= 200
            assert event.fields["message"].rstrip("€").strip("x") == ""


# -- reading: Queue.events and AsyncQueue.events -------------------------------------------------


def test_events_since_last_and_follow(queue):
    jobs = queue.enqueue_many([{"task": "t"}] * 7)
    every = list(queue.events())
    assert [e.job_id for e in every] == [j.id for j in jobs]
    assert [e.job_id for e in queue.events(last=3)] == [j.id for j in jobs[-3:]]
    assert [e.job_id for e in queue.events(since=every[4].stream_id)] == [j.id for j in jobs[5:]]
    assert list(queue.events(since="$")) == []
    assert list(queue.events(last=0)) == []
    assert len(list(queue.events(last=100))) == 7
    # follow: what is kept, then what comes, until the timeout
    late = []

    def produce() -> None:
        time.sleep(0.2)
        late.append(queue.enqueue("later").id)

    thread = threading.Thread(target=produce)
    thread.start()
    followed = list(queue.events(since=every[-1].stream_id, follow=True, timeout=1.0, block=0.1))
    thread.join()
    assert [e.job_id for e in followed] == late


def test_events_reads_a_long_stream_in_pages(queue):
    queue.enqueue_many([{"task": "t"}] * 1200)
    assert len(list(queue.events())) == 1200
    reader = EventReader(queue.keys)
    commands = 0
    while (command := reader.command()) is not None:
        commands += 1
        reader.feed(queue.redis.execute_command(*command))
    assert commands == 3  # 500 + 500 + 200


def test_events_refuses_bad_arguments(queue):
    with pytest.raises(ValueError, match="last must be"):
        list(queue.events(last=-1))
    with pytest.raises(ValueError, match="since must be"):
        list(queue.events(since=""))


def test_a_hostile_entry_written_by_another_client_is_read_not_raised(queue):
    queue.redis.xadd(queue.keys.events, {"x": "y"})
    queue.redis.xadd(queue.keys.events, {"event": "dead", "id": "j1", "odd": "1"})
    got = list(queue.events())
    assert (got[0].kind, got[0].job_id, got[0].fields) == ("", "", {"x": "y"})
    assert (got[1].kind, got[1].fields) == ("dead", {"odd": "1"})


def test_async_events_and_wait(redis_url, queue_name, queue):
    async def main() -> tuple[list[str], object]:
        async with AsyncQueue(queue_name, url=redis_url) as aq:
            job = await aq.enqueue("t", 1)
            seen = [e.kind async for e in aq.events()]

            async def finish() -> None:
                await asyncio.sleep(0.1)
                lease = await asyncio.to_thread(claim_one, queue)
                await asyncio.to_thread(leasing(queue).ack, job.id, lease.token, '"done"')

            task = asyncio.ensure_future(finish())
            result = await job.wait(timeout=10)
            await task
            followed = [e.kind async for e in aq.events(last=1, follow=True, timeout=0.3,
                                                       block=0.1)]
            assert await aq.event_settings() == {"events": True, "keep": 10000, "on_dead": None}
            await aq.set_on_dead("alerts.died")
            await aq.set_events(False)
            return seen + followed, result

    seen, result = asyncio.run(main())
    assert seen == ["enqueued", "succeeded"]
    assert result == "done"
    assert queue.event_settings() == {"events": False, "keep": 0, "on_dead": "alerts.died"}


# -- job.wait ----------------------------------------------------------------------------------


def _finish_later(queue: Queue, job_id: str, how: str, delay: float = 0.15) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        lease = claim_one(queue)
        if how == "ack":
            leasing(queue).ack(job_id, lease.token, '{"ok": 1}')
        else:
            leasing(queue).fail(job_id, lease.token, {"message": "nope"}, mode="fatal")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def count_reads(queue: Queue, job_id: str, timeout: float) -> tuple[int, tuple]:
    """Drive job.wait's plan on the real client, counting the times it reads the job."""
    plan = queue_events.wait(queue.keys, job_id, timeout, 0.05)
    reads = 0
    try:
        commands = next(plan)
        while True:
            reads += any(c[0] == "HGETALL" for c in commands)
            commands = plan.send(send(queue.redis, queue.scripts, commands))
    except StopIteration as done:
        return reads, done.value


def test_wait_blocks_on_the_stream_and_reads_the_job_once_it_ended(queue):
    job = queue.enqueue("t")
    thread = _finish_later(queue, job.id, "ack", delay=0.5)
    reads, (record, _history) = count_reads(queue, job.id, timeout=10)
    thread.join()
    assert record["state"] == "succeeded"
    assert reads == 2  # at the start, and once its end showed in the stream (polling: ~8)


def test_wait_with_events_off_reads_the_job_again_and_again(queue):
    queue.set_events(False)
    job = queue.enqueue("t")
    thread = _finish_later(queue, job.id, "ack", delay=0.5)
    reads, (record, _history) = count_reads(queue, job.id, timeout=10)
    thread.join()
    assert record["state"] == "succeeded"
    assert reads >= 4  # 10, 20, 40, 80, 160 ms ... apart


def test_wait_returns_the_result_or_raises(queue):
    ok = queue.enqueue("t")
    thread = _finish_later(queue, ok.id, "ack")
    assert ok.wait(timeout=10) == {"ok": 1}
    thread.join()
    dead = queue.enqueue("t")
    thread = _finish_later(queue, dead.id, "fail")
    with pytest.raises(JobFailed, match="nope"):
        dead.wait(timeout=10)
    thread.join()
    never = queue.enqueue("t", delay="1h")
    with pytest.raises(JobTimeout, match="still scheduled after 0.3s"):
        never.wait(timeout=0.3)


def test_wait_keeps_reading_the_job_when_the_stream_moved_on(queue):
    """A waiter whose job's end was trimmed out of the stream (a tiny cap, a flood of
    other events) still sees it: it reads the job at least every second."""
    queue.set_events(True, keep=1)
    job = queue.enqueue("t")

    def flood() -> None:
        time.sleep(0.1)
        lease = claim_one(queue)
        leasing(queue).ack(job.id, lease.token, "7")
        queue.enqueue_many([{"task": "noise"}] * 500)

    thread = threading.Thread(target=flood)
    thread.start()
    assert job.wait(timeout=10) == 7
    thread.join()


def test_wait_under_a_short_socket_timeout_blocks_less(redis_url, queue_name, queue):
    from forq.store.connection import connect

    client = connect(redis_url, socket_timeout=1.0)
    short = Queue(queue_name, redis=client)
    job = short.enqueue("t")
    thread = _finish_later(queue, job.id, "ack", delay=1.5)
    assert job.wait(timeout=10) == {"ok": 1}  # no socket timeout from a 1 s block
    thread.join()
    assert [e.kind for e in short.events(last=1, follow=True, timeout=0.5)] == ["succeeded"]


# -- on_dead ------------------------------------------------------------------------------------


def test_a_death_enqueues_the_on_dead_job_in_the_same_queue(queue):
    queue.set_on_dead("alerts.job_died")
    job = queue.enqueue("poison")
    lease = claim_one(queue)
    leasing(queue).fail(job.id, lease.token, {"message": "bad input"}, mode="fatal")
    notice = queue.get(f"{job.id}-on-dead-1")
    assert (notice.task, notice.state, notice.kwargs) == \
        ("alerts.job_died", "pending", {"job_id": job.id, "task": "poison", "reason": "bad input"})
    assert notice.fields["parent"] == job.id and notice.fields["on_dead_of"] == job.id
    assert queue.stats()["totals"]["enqueued"] == 2
    # the notice dies too: no notice of the notice
    lease = claim_one(queue)
    assert lease.id == notice.id
    leasing(queue).fail(notice.id, lease.token, {"message": "unknown task"}, mode="fatal")
    assert queue.stats()["pending"] == 0
    # requeued, the job dies again: a second notice
    queue.requeue_dead([job.id])
    lease = claim_one(queue)
    leasing(queue).fail(job.id, lease.token, {"message": "still bad"}, mode="fatal")
    assert queue.get(f"{job.id}-on-dead-2").kwargs["reason"] == "still bad"


def test_every_way_to_die_enqueues_the_on_dead_job(queue):
    queue.set_on_dead("alerts.job_died")
    crashed = queue.enqueue("crashy", max_crashes=1)
    lease = claim_one(queue)
    leasing(queue).expire(crashed.id, lease.token, "killed by SIGSEGV")
    leasing(queue).reclaim("reaper:1")
    parent = queue.enqueue("parent", delay="1h")
    child = queue.enqueue("child", depends_on=[parent.id])
    queue.cancel(parent.id)  # a cancelled parent: its dependent dies
    stale = queue.enqueue("stale", delay="100ms", expires_in="150ms")
    wait_for(lambda: leasing(queue).sweep_expired("reaper:1") or
             queue.get(stale.id).state == "dead", timeout=5)
    reasons = {queue.get(f"{dead}-on-dead-1").kwargs["reason"]
               for dead in (crashed.id, child.id, stale.id)}
    assert reasons == {"killed by SIGSEGV (crashes exhausted: 1)",
                       f"dependency {parent.id} was cancelled", "expired before start"}
    assert not queue.redis.exists(queue.keys.job(f"{parent.id}-on-dead-1"))  # cancelled


def test_on_dead_with_events_off_still_enqueues(queue):
    queue.set_events(False)
    queue.set_on_dead("alerts.job_died")
    job = queue.enqueue("poison")
    lease = claim_one(queue)
    leasing(queue).fail(job.id, lease.token, {"message": "x" * 5000}, mode="fatal")
    notice = queue.get(f"{job.id}-on-dead-1")
    assert len(notice.kwargs["reason"]) == 1000  # capped
    assert not queue.redis.exists(queue.keys.events)


@pytest.mark.parametrize("task", ["", "x" * 201, 5])
def test_set_on_dead_refuses_a_bad_task(queue, task):
    with pytest.raises(ValueError, match="on_dead must be a task name"):
        queue.set_on_dead(task)


def test_the_queues_numeric_settings_leave_the_on_dead_task_out(queue):
    queue.set_limits(max_in_flight=3)
    queue.set_on_dead("alerts.job_died")
    assert queue.limits() == {"max_in_flight": 3.0}


def test_set_on_dead_none_removes_it(queue):
    queue.set_on_dead("a.b")
    queue.set_on_dead(None)
    job = queue.enqueue("poison")
    lease = claim_one(queue)
    leasing(queue).fail(job.id, lease.token, {"message": "no"}, mode="fatal")
    assert queue.stats()["pending"] == 0


def test_the_scripts_default_and_largest_cap_are_the_clients():
    text = source("claim")  # includes/events.lua, pasted
    assert re.search(r"local EVENTS_KEEP = (\d+)", text).group(1) == str(queue_events.DEFAULT_KEEP)
    assert re.search(r"local EVENTS_KEEP_MAX = (\d+)", text).group(1) == \
        str(queue_events.MAX_KEEP)
