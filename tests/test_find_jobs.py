"""Find jobs and act on all of them (issue 29 item 6): lua/find.lua's walk and
forq.store.finder through the API, the asyncio API, the CLI and a real supervisor.

The walk must be bounded per page, lose no entry and repeat none when entries leave the
set between pages (ties in score included), refuse hostile filters with a clear line,
and a bulk action must skip (and count) a match that changed before its turn.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis as redis_lib

from forq import AsyncQueue, PayloadError, Queue
from forq.store import finder
from forq.store.pipelines import send
from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for, wait_job
from tests.supervisors import REPO, SupervisorProcess, write_config

OWNER = "find-test:1"
LONG = 60_000
TERMINAL = ("succeeded", "dead", "cancelled")


def dead_job(queue: Queue, task: str, message: str, **options) -> str:
    """A job of `task` that died of an error with `message` (one attempt)."""
    job = queue.enqueue(task, **options)
    lease = leasing(queue).claim(OWNER, 1, LONG).leases[0]
    assert lease.id == job.id, "one pending job at a time"
    leasing(queue).fail(job.id, lease.token,
                        {"type": "ValueError", "message": message}, "fatal")
    return job.id


def fake_dead(queue: Queue, job_id: str, score: int, task: str = "t.x") -> None:
    """A dead record written directly: many at one score, which the scripts rarely make."""
    queue.redis.hset(queue.keys.job(job_id), mapping={
        "id": job_id, "task": task, "state": "dead", "dead_reason": "r", "args": "[]",
        "kwargs": "{}", "finished_at": score})
    queue.redis.zadd(queue.keys.dead, {job_id: score})


def ids(jobs) -> list[str]:
    return [j.id for j in jobs]


# -- finding ----------------------------------------------------------------------------


def test_find_dead_by_task_error_and_argument(queue: Queue):
    a = dead_job(queue, "mail.send", "SMTP timeout after 30s", args=["ada@example.com"])
    b = dead_job(queue, "mail.send", "mailbox full", args=["bob@example.com"])
    c = dead_job(queue, "sms.send", "SMTP timeout", kwargs={"to": "ada@example.com"})
    assert set(ids(queue.find("dead").jobs)) == {a, b, c}
    assert set(ids(queue.find("dead", task="mail.send").jobs)) == {a, b}
    assert set(ids(queue.find("dead", error=r"timeout after \d+s").jobs)) == {a}
    assert set(ids(queue.find("dead", error="^ValueError: SMTP").jobs)) == {a, c}
    assert set(ids(queue.find("dead", args_contains="ada@").jobs)) == {a, c}
    assert set(ids(queue.find("dead", task="mail.send", args_contains="ada@").jobs)) == {a}
    assert set(ids(queue.find("dead", args_contains="%d.*").jobs)) == set()  # plain text, no pattern
    page = queue.find("dead", task="sms.send")
    assert page.cursor is None and page.jobs[0].reason == "SMTP timeout"
    assert page.jobs[0].state == "dead" and page.jobs[0].task == "sms.send"


def test_find_by_age(queue: Queue, r: redis_lib.Redis):
    old = dead_job(queue, "t.a", "x")
    r.zadd(queue.keys.dead, {old: 1_000})  # died in 1970
    r.hset(queue.keys.job(old), "finished_at", 1_000)
    new = dead_job(queue, "t.a", "x")
    assert ids(queue.find("dead", since="1h").jobs) == [new]
    assert ids(queue.find("dead", before="1h").jobs) == [old]
    assert ids(queue.find("dead", since=3600, before=60).jobs) == []
    pending_old = queue.enqueue("t.p")
    r.hset(queue.keys.job(pending_old.id), "enqueued_at", 1_000)
    pending_new = queue.enqueue("t.p")
    assert ids(queue.find("pending", since="10m").jobs) == [pending_new.id]
    assert ids(queue.find("pending", before="10m").jobs) == [pending_old.id]


def test_find_pending_grouped_scheduled_waiting_active_and_finished(queue: Queue):
    plain = queue.enqueue("t.a")
    grouped = queue.enqueue("t.a", group="g1")
    later = queue.enqueue("t.a", delay="1h")
    parent = queue.enqueue("t.parent", delay="1h")
    child = queue.enqueue("t.a", depends_on=[parent])
    assert ids(queue.find("pending").jobs) == [plain.id]
    assert ids(queue.find("pending", group="g1").jobs) == [grouped.id]
    assert ids(queue.find("pending", group="nope").jobs) == []
    assert set(ids(queue.find("scheduled").jobs)) == {later.id, parent.id}
    assert ids(queue.find("waiting").jobs) == [child.id]
    lease = leasing(queue).claim(OWNER, 1, LONG).leases[0]
    assert ids(queue.find("active").jobs) == [lease.id]
    leasing(queue).ack(lease.id, lease.token, "1")
    queue.cancel(later.id)
    assert ids(queue.find("succeeded").jobs) == [lease.id]
    assert ids(queue.find("cancelled").jobs) == [later.id]


def test_a_page_is_bounded_work_and_a_sparse_walk_goes_on_from_its_cursor(queue: Queue):
    for i in range(2500):
        fake_dead(queue, f"j{i:05d}", 1_000 + i, task="t.rare" if i in (7, 2400) else "t.x")
    page = queue.find("dead", task="t.rare", count=1)
    assert ids(page.jobs) == ["j00007"] and page.cursor
    page = queue.find("dead", task="t.rare", count=5, cursor=page.cursor)
    assert ids(page.jobs) == ["j02400"] and page.examined == 2500 - 8
    # a page stops after MAX_CALLS calls of EXAMINE entries, whatever it found
    assert page.examined <= finder.MAX_CALLS * finder.EXAMINE
    assert list(ids(queue.find_iter("dead", task="t.rare"))) == ["j00007", "j02400"]
    assert len(list(queue.find_iter("dead", limit=30))) == 30


def test_the_walk_loses_and_repeats_nothing_when_entries_leave_between_pages(queue: Queue,
                                                                             r: redis_lib.Redis):
    # 40 entries in 4 ties of equal score: equal scores are ordered by id
    all_ids = [f"k{i:02d}" for i in range(40)]
    for i, job_id in enumerate(all_ids):
        fake_dead(queue, job_id, 5_000 + i // 10)
    seen: list[str] = []
    cursor = None
    while True:
        page = queue.find("dead", cursor=cursor, count=3)
        seen += ids(page.jobs)
        for job in page.jobs[-1:]:  # the cursor's own entry leaves the set
            r.zrem(queue.keys.dead, job.id)
        cursor = page.cursor
        if cursor is None:
            break
    assert seen == all_ids


def test_a_record_gone_from_under_its_index_is_counted_not_listed(queue: Queue,
                                                                  r: redis_lib.Redis):
    kept = dead_job(queue, "t.a", "x")
    trimmed = dead_job(queue, "t.a", "x")
    r.delete(queue.keys.job(trimmed))  # retention trimmed the record, not yet the index
    page = queue.find("dead")
    assert ids(page.jobs) == [kept] and page.gone == 1


# -- hostile filters ----------------------------------------------------------------------


@pytest.mark.parametrize("filters, needle", [
    ({"state": "nope"}, "state must be one of"),
    ({"error": "(a+)+$"}, "exponential"),
    ({"error": "(a|ab)*c"}, "exponential"),
    ({"error": "(x*)*"}, "exponential"),
    ({"error": "(?:a{2,})+"}, "exponential"),
    ({"error": "["}, "not a regular expression"),
    ({"error": "a" * 201}, "over the 200-character cap"),
    ({"error": ""}, "non-empty"),
    ({"task": "t" * 201}, "task must be a name"),
    ({"args_contains": "x" * 1001}, "args_contains must be text"),
    ({"args_contains": ""}, "args_contains must be text"),
    ({"group": ""}, "group must not be empty"),
    ({"since": "soon"}, "since"),
    ({"since": "-1h"}, "since"),
    ({"before": True}, "before must be a duration"),
])
def test_hostile_filters_are_refused_with_a_clear_line(queue: Queue, filters, needle):
    state = filters.pop("state", "dead")
    with pytest.raises(PayloadError, match=needle):
        queue.find(state, **filters)


def test_safe_patterns_pass():
    for ok in (r"timeout after \d+s", "(foo|bar) failed", "a+b+c", "(ab)+", "x{1,3}",
               r"^ValueError: .*host (a|b)$", "(?i)smtp"):
        finder.safe_pattern(ok)


@pytest.mark.parametrize("cursor", ["nonsense", "|x", "1|", "abc|x"])
def test_a_cursor_of_another_walk_is_refused(queue: Queue, cursor: str):
    with pytest.raises(PayloadError, match="not a cursor"):
        queue.find("dead", cursor=cursor)


def test_find_count_is_bounded(queue: Queue):
    for bad in (0, 1001, "10"):
        with pytest.raises(PayloadError, match="count must be"):
            queue.find("dead", count=bad)


def test_the_error_pattern_sees_a_bounded_reason(queue: Queue, r: redis_lib.Redis):
    job = dead_job(queue, "t.a", "x" * 50_000 + "NEEDLE")
    assert ids(queue.find("dead", error="NEEDLE").jobs) == []  # past REASON_CHARS
    assert ids(queue.find("dead", error="^ValueError: x+$").jobs) == [job]
    long_error = queue.find("dead").jobs[0].fields["error"]
    assert len(long_error) < 1100 and json.loads(long_error)["type"] == "ValueError"


# -- bulk actions -------------------------------------------------------------------------


def test_bulk_requeue_dead_by_error_then_purge_the_rest(queue: Queue):
    timeouts = [dead_job(queue, "t.a", f"timeout {i}") for i in range(3)]
    others = [dead_job(queue, "t.a", "boom") for _ in range(2)]
    result = queue.bulk("requeue", "dead", error="timeout")
    assert (result.matched, result.done, result.skipped) == (3, 3, 0)
    for job_id in timeouts:
        job = queue.get(job_id)
        assert job.state == "pending" and job.history[-1]["event"] == "requeued"
    result = queue.bulk("purge", "dead")
    assert (result.matched, result.done) == (2, 2)
    assert all(queue.redis.exists(queue.keys.job(j)) == 0 for j in others)


def test_bulk_cancel_scheduled_leaves_a_job_that_started_meanwhile(queue: Queue):
    jobs = [queue.enqueue("t.a", delay="1h").id for _ in range(3)]
    result = queue.bulk("cancel", "scheduled", task="t.a")
    assert (result.matched, result.done) == (3, 3)
    assert all(queue.get(j).state == "cancelled" for j in jobs)
    assert queue.bulk("cancel", "scheduled").matched == 0


def test_bulk_promote_scheduled_and_limit(queue: Queue):
    jobs = [queue.enqueue("t.a", delay="1h").id for _ in range(5)]
    result = queue.bulk("promote", "scheduled", limit=2)
    assert (result.matched, result.done, result.more) == (2, 2, True)
    assert sorted(queue.get(j).state for j in jobs) == ["pending"] * 2 + ["scheduled"] * 3


def test_bulk_skips_a_match_whose_record_was_trimmed_between_list_and_act(queue: Queue,
                                                                          r: redis_lib.Redis):
    kept = dead_job(queue, "t.a", "x")
    trimmed = dead_job(queue, "t.a", "x")
    plan = finder.act(queue.keys, finder.JobFilter("dead"), "requeue")
    commands = plan.send(send(r, queue.scripts, next(plan)))  # the bound, then the walk
    page = send(r, queue.scripts, commands)
    r.delete(queue.keys.job(trimmed))  # retention trims it after the walk saw it
    commands = plan.send(page)  # the requeue of both
    with pytest.raises(StopIteration) as finished:
        while True:
            commands = plan.send(send(r, queue.scripts, commands))
    result = finished.value.value
    assert (result.matched, result.done, result.skipped) == (2, 1, 1)
    assert queue.get(kept).state == "pending"
    assert r.zscore(queue.keys.dead, trimmed) is None  # its index entry went with it


def test_bulk_does_not_chase_a_job_that_dies_again(queue: Queue, r: redis_lib.Redis,
                                                  monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(finder, "ACT_BATCH", 1)  # a page per job
    first = dead_job(queue, "t.a", "x")
    second = dead_job(queue, "t.a", "x")
    if r.zscore(queue.keys.dead, first) == r.zscore(queue.keys.dead, second):
        first, second = sorted((first, second))  # one ms: by id
    plan = finder.act(queue.keys, finder.JobFilter("dead"), "requeue")
    commands = plan.send(send(r, queue.scripts, next(plan)))  # the bound, then page 1
    commands = plan.send(send(r, queue.scripts, commands))  # page 1 -> requeue `first`
    commands = plan.send(send(r, queue.scripts, commands))  # requeued -> page 2
    assert queue.get(first).state == "pending"
    bound = r.zscore(queue.keys.dead, second)
    wait_for(lambda: r.time()[0] * 1000 + r.time()[1] // 1000 > bound, timeout=2,
             message="Redis's clock past the walk's bound")
    lease = leasing(queue).claim(OWNER, 1, LONG).leases[0]
    leasing(queue).fail(first, lease.token, {"message": "again"}, "fatal")  # dies again
    with pytest.raises(StopIteration) as finished:
        while True:
            commands = plan.send(send(r, queue.scripts, commands))
    result = finished.value.value
    assert (result.matched, result.done) == (2, 2)  # not 3: `first` is not chased
    assert queue.get(first).state == "dead" and queue.get(second).state == "pending"


@pytest.mark.parametrize("action, state, needle", [
    ("requeue", "pending", "requeue acts on dead jobs, not pending"),
    ("promote", "dead", "promote acts on scheduled jobs"),
    ("cancel", "succeeded", "cancel acts on pending or scheduled"),
    ("explode", "dead", "action must be one of"),
])
def test_bulk_refuses_an_action_on_a_state_it_does_not_apply_to(queue: Queue, action, state,
                                                               needle):
    with pytest.raises(PayloadError, match=needle):
        queue.bulk(action, state)


# -- asyncio ------------------------------------------------------------------------------


def test_async_queue_finds_and_acts_with_the_same_scripts(redis_url: str, queue: Queue):
    a = dead_job(queue, "t.a", "timeout")
    dead_job(queue, "t.b", "boom")

    async def main() -> None:
        async with AsyncQueue(queue.name, url=redis_url) as aq:
            page = await aq.find("dead", error="time")
            assert [j.id for j in page.jobs] == [a] and page.cursor is None
            # the sync queue's order (two deaths in one millisecond tie on the score:
            # then the order is the ids', not the deaths')
            assert [j.id async for j in aq.find_iter("dead")] == [
                j.id for j in queue.find_iter("dead")]
            result = await aq.bulk("requeue", "dead", task="t.a")
            assert (result.matched, result.done) == (1, 1)

    asyncio.run(main())
    assert queue.get(a).state == "pending"


# -- the CLI ------------------------------------------------------------------------------


def forq(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url,
                           *args], capture_output=True, text=True, timeout=30, cwd=REPO)


def test_cli_lists_counts_then_acts_with_yes(redis_url: str, queue: Queue):
    a = dead_job(queue, "mail.send", "SMTP timeout", args=["ada@example.com"])
    b = dead_job(queue, "mail.send", "SMTP timeout", args=["bob@example.com"])
    dead_job(queue, "mail.send", "mailbox full")
    listed = forq(redis_url, "jobs", queue.name, "--state", "dead", "--task", "mail.send",
                  "--error", "time.ut", "--since", "1h")
    assert listed.returncode == 0, listed.stderr
    assert a in listed.stdout and b in listed.stdout and "SMTP timeout" in listed.stdout
    listed = json.loads(forq(redis_url, "jobs", queue.name, "--state", "dead",
                             "--args-contains", "bob@", "--json").stdout)
    assert [j["id"] for j in listed["jobs"]] == [b] and listed["cursor"] is None
    order = [j.id for j in queue.find("dead").jobs]  # by death, one ms's deaths by id
    paged = json.loads(forq(redis_url, "jobs", queue.name, "--state", "dead", "--limit", "1",
                            "--json").stdout)
    assert [j["id"] for j in paged["jobs"]] == order[:1] and paged["cursor"]
    rest = json.loads(forq(redis_url, "jobs", queue.name, "--state", "dead", "--cursor",
                           paged["cursor"], "--json").stdout)
    assert [j["id"] for j in rest["jobs"]] == order[1:]

    dry = forq(redis_url, "jobs", queue.name, "--state", "dead", "--error", "SMTP", "--requeue")
    assert dry.returncode == 1 and "would requeue 2 dead jobs" in dry.stderr
    assert queue.get(a).state == "dead"
    done = forq(redis_url, "jobs", queue.name, "--state", "dead", "--error", "SMTP",
                "--requeue", "--yes")
    assert done.returncode == 0 and "requeued 2 of 2 matching jobs" in done.stdout, done.stderr
    assert queue.get(a).state == queue.get(b).state == "pending"
    done = forq(redis_url, "jobs", queue.name, "--state", "dead", "--purge", "--yes", "--json")
    assert json.loads(done.stdout)["done"] == 1
    empty = forq(redis_url, "jobs", queue.name, "--state", "dead")
    assert "no jobs in queue" in empty.stdout


@pytest.mark.parametrize("argv, needle", [
    (["--state", "dead", "--error", "(a+)+"], "exponential"),
    (["--state", "dead", "--error", "[oops"], "not a regular expression"),
    (["--state", "pending", "--requeue"], "--requeue acts on dead jobs, not pending"),
    (["--state", "dead", "--requeue", "--purge"], "one action at a time"),
    (["--state", "dead", "--since", "yesterday"], "since"),
    (["--state", "dead", "--cursor", "garbage"], "not a cursor"),
    (["--state", "limbo"], "invalid choice"),
    (["--limit", "0"], "--limit"),
])
def test_cli_bad_filters_are_one_line(redis_url: str, queue: Queue, argv, needle):
    done = forq(redis_url, "jobs", queue.name, *argv)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1


# -- a real supervisor --------------------------------------------------------------------


def test_supervisor_reruns_the_jobs_a_bulk_requeue_picked_by_error(tmp_path: Path,
                                                                   redis_url: str,
                                                                   queue: Queue):
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2})
    with SupervisorProcess(config).start() as sup:
        flaky = [queue.enqueue("tests.fail", "flaky upstream", max_attempts=1) for _ in range(3)]
        broken = [queue.enqueue("tests.fail", "bad input", max_attempts=1) for _ in range(2)]
        for job in flaky + broken:
            assert wait_job(queue, job.id, TERMINAL, context=lambda: sup.log()[-3000:]).state == "dead"
        result = queue.bulk("requeue", "dead", error="upstream", task="tests.fail")
        assert (result.matched, result.done) == (3, 3)
        for job in flaky:
            wait_for(lambda j=job: queue.get(j.id).state == "dead"
                     and [e["event"] for e in queue.get(j.id).history].count("dead") == 2,
                     timeout=15, message=f"{job.id} ran again and died again")
        for job in broken:
            assert [e["event"] for e in queue.get(job.id).history].count("dead") == 1
