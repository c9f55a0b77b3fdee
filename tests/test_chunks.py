"""Chunked handlers (`task(chunk=N)`, supervisor/children/chunks.py) with a real
supervisor and Redis: the jobs of a chunk run in one child, each ends on its own —
as the handler reported it, or, if it was not reported, as the process ended (a crash
retries only those, a time limit fails only those) — and a child that reports for a
job outside its chunk, or twice, or more than its jobs, is stopped, its lies unheard.

Jobs are enqueued before the supervisor starts (concurrency 1), so its first claim
leases them together; tests/chunk_tasks.py notes each run in a file, outside Redis.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from forq import Queue, task
from forq.errors import JobNotFound
from forq.job import Job
from forq.registry import TaskSpec
from forq.supervisor.children.chunk_reader import ChunkReader
from forq.supervisor.fork.protocol import BadTaskTable, describe, parse
from forq.supervisor.leases.calls import leasing
from tests import helpers
from tests.supervisors import REPO, TEST_IMPORTS, SupervisorProcess, write_config

TERMINAL = ("succeeded", "dead", "cancelled")


def supervisor(tmp_path: Path, redis_url: str, queue: Queue, concurrency: int = 1,
               **options: Any) -> SupervisorProcess:
    options.setdefault("drain_timeout", "1s")
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: concurrency},
                          imports=(*TEST_IMPORTS, "tests.chunk_tasks"), **options)
    return SupervisorProcess(config)


def finished(queue: Queue, ids: list[str], sup: SupervisorProcess,
             timeout: float = 20.0) -> dict[str, Job]:
    return {i: helpers.wait_job(queue, i, TERMINAL, timeout,
                                context=lambda: sup.log()[-4000:]) for i in ids}


def runs(notes: Path) -> list[tuple[int, str]]:
    """(pid, job id) of each run noted, in order."""
    return [(int(pid), job_id) for pid, job_id, _what in
            (line.split() for line in notes.read_text().splitlines())]


def enqueue(queue: Queue, task_name: str, notes: Path, *seconds: Any, **options: Any) -> list[str]:
    jobs = [{"task": task_name, "args": [str(notes), arg], **options} for arg in seconds]
    return [job.id for job in queue.enqueue_many(jobs)]


def test_chunk_size_is_checked_where_the_task_is_declared():
    for bad in (0, 33, True, "4"):
        with pytest.raises(ValueError, match="chunk must be an integer from 1 to 32"):
            task("bad.chunk", chunk=bad)


@pytest.mark.timeout(60)
def test_a_chunk_runs_its_jobs_in_one_child_and_each_succeeds(tmp_path, redis_url, queue):
    notes = tmp_path / "notes"
    ids = enqueue(queue, "chunks.record", notes, *range(8))
    with supervisor(tmp_path, redis_url, queue) as sup:
        jobs = finished(queue, ids, sup)
    assert {j.state for j in jobs.values()} == {"succeeded"}, sup.log()[-3000:]
    assert all(j.result is None and (j.attempts, j.crashes) == (1, 0) for j in jobs.values())
    assert all([e["event"] for e in j.history] == ["enqueued", "claimed", "succeeded"]
               for j in jobs.values())
    ran = runs(notes)
    assert sorted(i for _, i in ran) == sorted(ids)
    assert len({pid for pid, _ in ran}) == 1, ran  # one child for the eight


@pytest.mark.timeout(60)
def test_a_job_alone_is_a_chunk_of_one_and_starts_at_once(tmp_path, redis_url, queue):
    notes = tmp_path / "notes"
    with supervisor(tmp_path, redis_url, queue, concurrency=2) as sup:
        first = enqueue(queue, "chunks.record", notes, "a")
        job = finished(queue, first, sup)[first[0]]
        assert job.state == "succeeded", job.history
        second = enqueue(queue, "chunks.record", notes, "b")
        assert finished(queue, second, sup)[second[0]].state == "succeeded"
    ran = runs(notes)
    assert [i for _, i in ran] == first + second
    assert ran[0][0] != ran[1][0]  # each in a child of its own: nothing waited to fill


@pytest.mark.timeout(60)
def test_each_job_of_a_chunk_is_acked_failed_or_dead_on_its_own(tmp_path, redis_url, queue):
    notes = tmp_path / "notes"
    jobs = [{"task": "chunks.mixed", "args": [str(notes), kind], "max_attempts": attempts,
             "backoff": {"base": "1ms", "jitter": 0}}
            for kind, attempts in (("ok", 1), ("fail", 2), ("fatal", 5), ("ok", 1))]
    ok, fail, fatal, ok2 = [j.id for j in queue.enqueue_many(jobs)]
    with supervisor(tmp_path, redis_url, queue) as sup:
        done = finished(queue, [ok, fail, fatal, ok2], sup)
    assert (done[ok].state, done[ok].result) == ("succeeded", f"done {ok}")
    assert (done[ok2].state, done[ok2].result) == ("succeeded", f"done {ok2}")
    # retried per its own max_attempts: two runs, then dead
    assert (done[fail].state, done[fail].attempts) == ("dead", 2), done[fail].history
    assert f"boom {fail}" in (done[fail].reason or "")
    assert (done[fatal].state, done[fatal].attempts) == ("dead", 1)  # NonRetryable
    assert Counter(i for _, i in runs(notes)) == {ok: 1, fail: 2, fatal: 1, ok2: 1}


@pytest.mark.timeout(60)
def test_a_job_of_a_chunk_snoozes_and_sees_its_snoozes(tmp_path, redis_url, queue):
    """`job.fail(Retry(...))` puts one job off, no attempt counted; its next run's
    `ChunkJob.snoozes` says so, as `current().snoozes` does for a job of its own."""
    notes = tmp_path / "notes"
    ids = enqueue(queue, "chunks.snooze", notes, "a", "b", "c")
    with supervisor(tmp_path, redis_url, queue) as sup:
        done = finished(queue, ids, sup)
    for job in done.values():
        assert (job.state, job.result, job.snoozes, job.attempts) == ("succeeded", 1, 1, 1), \
            job.history
        assert [e["event"] for e in job.history] == ["enqueued", "claimed", "snoozed",
                                                    "claimed", "succeeded"], job.history
    seen = [line.split()[1:] for line in notes.read_text().splitlines()]
    assert sorted(seen) == sorted([[i, f"snoozes={n}"] for i in ids for n in (0, 1)])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fork_server", [True, False], ids=["fork-server", "exec-alone"])
def test_a_chunk_killed_mid_way_retries_only_the_jobs_it_had_not_reported(
        tmp_path, redis_url, queue, fork_server):
    notes = tmp_path / "notes"
    a, b, c, d = enqueue(queue, "chunks.crash", notes, "ok", "ok", "crash", "ok")
    extra = "" if fork_server else "fork_server = false\n"
    with supervisor(tmp_path, redis_url, queue, supervisor_extra=extra) as sup:
        done = finished(queue, [a, b, c, d], sup)
    assert {j.state for j in done.values()} == {"succeeded"}, sup.log()[-3000:]
    # reported before the SIGKILL: settled, run once, no crash counted
    assert [(done[i].crashes, done[i].result) for i in (a, b)] == [(0, a), (0, b)]
    # not reported: expired with the process (a crash each), run again
    assert [done[i].crashes for i in (c, d)] == [1, 1]
    assert all("SIGKILL" in str(done[i].history) for i in (c, d))
    assert Counter(i for _, i in runs(notes)) == {a: 1, b: 1, c: 2, d: 1}


@pytest.mark.timeout(60)
def test_a_chunk_that_exits_after_reporting_one_job_retries_the_others(
        tmp_path, redis_url, queue):
    notes = tmp_path / "notes"
    first, *rest = enqueue(queue, "chunks.exit_after_first", notes, 1, 2, 3)
    with supervisor(tmp_path, redis_url, queue) as sup:
        done = finished(queue, [first, *rest], sup)
    assert (done[first].state, done[first].crashes, done[first].result) == (
        "succeeded", 0, "first")
    for i in rest:
        assert (done[i].state, done[i].crashes) == ("succeeded", 1), done[i].history
        assert "exited with code 3" in str(done[i].history)


@pytest.mark.timeout(60)
def test_the_time_limit_is_the_chunks_and_fails_the_jobs_not_reported(
        tmp_path, redis_url, queue):
    notes = tmp_path / "notes"
    first, *rest = enqueue(queue, "chunks.stuck", notes, 1, 2, 3, timeout="1s",
                           max_attempts=1)
    with supervisor(tmp_path, redis_url, queue) as sup:
        done = finished(queue, [first, *rest], sup)
    assert (done[first].state, done[first].result) == ("succeeded", "before the limit")
    for i in rest:
        assert done[i].state == "dead", done[i].history
        assert "timeout" in (done[i].reason or ""), done[i].reason


@pytest.mark.timeout(60)
def test_leases_of_a_chunk_are_kept_while_it_runs(tmp_path, redis_url, queue):
    notes = tmp_path / "notes"
    ids = enqueue(queue, "chunks.slow", notes, 2.5, 0, 0)
    with supervisor(tmp_path, redis_url, queue, lease_ttl="1s") as sup:
        done = finished(queue, ids, sup)
    for job in done.values():  # 2.5 s on a 1 s lease: extended, never reclaimed
        assert (job.state, job.crashes) == ("succeeded", 0), job.history
        assert [e["event"] for e in job.history] == ["enqueued", "claimed", "succeeded"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("lie", "said"), [
    ("stranger", "reported for job 'someone-else', which is not in its chunk"),
    ("twice", "twice"),
    ("extra", "wrote after the results of all 3 jobs of its chunk"),
])
def test_a_chunk_cannot_report_for_a_job_outside_it_or_more_than_its_jobs(
        tmp_path, redis_url, queue, lie, said):
    notes = tmp_path / "notes"
    first, *rest = enqueue(queue, "chunks.hostile", notes, lie, lie, lie)
    with supervisor(tmp_path, redis_url, queue) as sup:
        done = finished(queue, [first, *rest], sup)
        log = sup.log()
    assert said in log, log[-3000:]
    # its honest report stands; its lie changed nothing
    assert (done[first].state, done[first].result, done[first].crashes) == (
        "succeeded", "first", 0)
    with pytest.raises(JobNotFound):
        queue.get("someone-else")
    for i in rest:
        if lie == "extra":  # reported honestly before the extra result
            assert (done[i].state, done[i].result, done[i].crashes) == ("succeeded", "ok", 0)
        else:  # not reported when it was stopped: a crash, then run again
            assert (done[i].state, done[i].result, done[i].crashes) == (
                "succeeded", "honest", 1), done[i].history
            assert "malformed" in str(done[i].history)


@pytest.mark.timeout(60)
def test_a_cancel_stops_the_chunk_and_gives_its_other_unreported_jobs_back(
        tmp_path, redis_url, queue):
    notes, gate = tmp_path / "notes", tmp_path / "gate"
    a, b, c = enqueue(queue, "chunks.wait_file", notes, str(gate), str(gate), str(gate))
    with supervisor(tmp_path, redis_url, queue, lease_ttl="1s") as sup:
        helpers.wait_for(lambda: notes.exists() and notes.read_text(), timeout=20,
                         message="the chunk reported its first job")
        assert queue.cancel(b) == "cancelling"
        helpers.wait_job(queue, b, ("cancelled",), 20, context=lambda: sup.log()[-3000:])
        helpers.wait_for(lambda: "released" in [e["event"] for e in queue.get(c).history],
                         timeout=20, message="the chunk's other job given back")
        gate.touch()  # c runs again, alone: it may finish now
        done = finished(queue, [a, c], sup)
    assert (done[a].state, done[a].result, done[a].attempts) == ("succeeded", "first", 1)
    assert queue.get(b).state == "cancelled"
    # released: nothing counted, then run again to success
    assert (done[c].state, done[c].crashes, done[c].attempts) == ("succeeded", 0, 1), \
        done[c].history
    assert "another job of its chunk was cancelled" in str(done[c].history)


def test_forq_top_shows_each_job_of_a_running_chunk_in_its_one_process(
        tmp_path, redis_url, queue):
    notes, gate = tmp_path / "notes", tmp_path / "gate"
    ids = enqueue(queue, "chunks.wait_file", notes, str(gate), str(gate), str(gate))
    with supervisor(tmp_path, redis_url, queue) as sup:
        def listed() -> list[dict[str, Any]] | None:
            done = subprocess.run(
                [sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url, "top",
                 "--once", "--json", "-q", queue.name],
                capture_output=True, text=True, timeout=30, cwd=str(REPO))
            assert done.returncode == 0, done.stderr
            rows = [job for job in json.loads(done.stdout) if job["id"] in ids]
            # a second heartbeat gives the process's CPU figures
            return rows if len(rows) == 3 and any("cpu" in r["child"] for r in rows) else None

        rows = helpers.wait_for(listed, timeout=30, interval=0.3,
                                message="the chunk's three jobs in forq top")
        assert len({row["child"]["pid"] for row in rows}) == 1, rows  # one process
        assert all(row["child"]["lease_left"] > 0 for row in rows), rows  # each its lease
        # its CPU counted once, on one of its rows
        assert sum("cpu" in row["child"] for row in rows) == 1, rows
        gate.touch()
        done = finished(queue, ids, sup)
    assert all(job.state == "succeeded" for job in done.values())


# -- what the parent reads (no supervisor) ------------------------------------------------


def reader(*ids: str) -> ChunkReader:
    return ChunkReader(list(ids), 1 << 16, "q")


def feed(r: ChunkReader, *messages: dict[str, Any]) -> ChunkReader:
    r.feed(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
    return r


def test_the_reader_takes_one_result_per_job_of_the_chunk():
    r = feed(reader("a", "b"), {"t": "began", "at": 1.5},
             {"t": "result", "job": "b", "ok": True, "result": [1]},
             {"t": "result", "job": "a", "ok": False,
              "error": {"type": "ValueError", "message": "x"}})
    assert not r.violation and r.began == 1.5
    assert r.reports["b"].ok and r.reports["b"].result_json == "[1]"
    assert not r.reports["a"].ok and r.reports["a"].error["reason"] == "ValueError: x"


@pytest.mark.parametrize(("messages", "said"), [
    ([{"t": "result", "job": "c", "ok": True}], "'c', which is not in its chunk"),
    ([{"t": "result", "ok": True}], "None, which is not in its chunk"),
    ([{"t": "result", "job": "a", "ok": True}] * 2, "reported job a twice"),
    ([{"t": "result", "job": "a", "ok": True}, {"t": "result", "job": "b", "ok": True},
      {"t": "result", "job": "b", "ok": True}], "wrote after the results of all 2 jobs"),
    ([{"t": "progress", "progress": 0.5}], "a chunk sends only results, not 'progress'"),
    ([{"t": "step", "name": "s", "result": 1}], "a chunk sends only results, not 'step'"),
    ([{"t": "began", "at": 1}, {"t": "began", "at": 2}], "says began once"),
    ([{"t": "result", "job": "a", "ok": "yes"}], "result.ok must be true or false"),
])
def test_the_reader_refuses_what_a_chunk_may_not_say(messages, said):
    r = feed(reader("a", "b"), *messages)
    assert said in r.violation, r.violation
    assert r.done


def test_the_task_table_carries_chunks_and_refuses_bad_ones():
    table = describe({"t.one": TaskSpec("t.one", print), "t.many": TaskSpec("t.many", print,
                                                                         chunk=8)})
    assert table == {"t.one": {"idempotent": False},
                     "t.many": {"idempotent": False, "chunk": 8}}
    assert parse(table)["t.many"].chunk == 8 and parse(table)["t.one"].chunk == 1
    for bad in (0, 33, "8", True):
        with pytest.raises(BadTaskTable, match="chunk must be an integer"):
            parse({"t.x": {"chunk": bad}})


def test_forq_replay_runs_a_chunked_job_alone_as_a_chunk_of_one(tmp_path, redis_url, queue):
    notes = tmp_path / "notes"
    job = queue.enqueue("chunks.mixed", str(notes), "fail")
    (lease,) = leasing(queue).claim("chunk-test:1", 1, 60_000).leases
    leasing(queue).fail(lease.id, lease.token, {"message": "x", "reason": "no"}, mode="fatal")
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1},
                          imports=("tests.chunk_tasks",))
    proc = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "replay", job.id,
                           "--config", str(config)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert f"replay of {job.id}: failed: ValueError: boom {job.id}" in proc.stdout, (
        proc.stdout + proc.stderr)
    assert runs(notes) and runs(notes)[0][1] == job.id  # its handler got it in a list
