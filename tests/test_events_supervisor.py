"""Events, on_dead, job.wait, replace and debounce through a real `forq run`: what the
scripts write when a real supervisor runs, crashes and fails real children, and what a
producer, the CLI and a handler see. One supervisor per test, a few jobs each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from forq import Queue
from tests.helpers import wait_for, wait_job
from tests.supervisors import REPO, TEST_IMPORTS, SupervisorProcess, write_config

IMPORTS = (*TEST_IMPORTS, "tests.steps_tasks")


def start(tmp_path: Path, redis_url: str, queue: Queue, queue_extra: str = "",
          extra: str = "", **options: Any) -> SupervisorProcess:
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2}, imports=IMPORTS,
                          drain_timeout="1s", queue_extra=queue_extra, extra=extra, **options)
    return SupervisorProcess(config).start()


def by_job(queue: Queue, job_id: str) -> list[Any]:
    return [e for e in queue.events() if e.job_id == job_id]


def test_a_supervisor_writes_each_jobs_story_and_on_dead_reports_deaths(tmp_path, redis_url,
                                                                        queue):
    """Progress, success, a handler's failure, a crash past max_crashes: each job's
    events name the supervisor, and each death enqueues the on_dead job (tests.echo,
    which returns what it got)."""
    go = tmp_path / "go"
    sup = start(tmp_path, redis_url, queue, queue_extra='on_dead = "tests.echo"\n')
    with sup:
        me = f"{os.uname().nodename}:{sup.pid}"
        progress = queue.enqueue("steps.progress", str(go))
        wait_for(lambda: any(e.kind == "progress" for e in by_job(queue, progress.id)),
                 timeout=20, message="progress event")
        go.touch()
        assert progress.wait(timeout=20) == "ok"
        # a hostile handler's error: 30 KB of multi-byte text, cut in the stream
        failing = queue.enqueue("tests.fail", "€" * 10_000, max_attempts=1)
        crashing = queue.enqueue("examples.exit", 7, max_crashes=1)
        for job in (failing, crashing):
            wait_job(queue, job.id, ("dead",), timeout=20)
            notice = wait_job(queue, f"{job.id}-on-dead-1", ("succeeded",), timeout=20)
            assert notice.result["kwargs"]["job_id"] == job.id
        story = by_job(queue, progress.id)
        assert [e.kind for e in story] == ["enqueued", "started", "progress", "progress",
                                           "succeeded"]
        assert {e.supervisor for e in story[1:]} == {me}
        assert (story[2].fields["value"], story[2].fields["message"]) == ("0.5", "half way")
        assert [e.kind for e in by_job(queue, failing.id)] == ["enqueued", "started", "failed",
                                                               "dead"]
        reason = by_job(queue, failing.id)[-1].reason
        assert reason.startswith("ValueError: €") and len(reason.encode()) <= 200
        crash = by_job(queue, crashing.id)
        assert [e.kind for e in crash] == ["enqueued", "started", "failed", "dead"]
        assert "exit" in crash[2].reason and crash[2].supervisor == me
        notice = queue.get(f"{crashing.id}-on-dead-1")
        assert notice.result["kwargs"] == {"job_id": crashing.id, "task": "examples.exit",
                                           "reason": crash[-1].reason}
        assert [e.kind for e in by_job(queue, notice.id)] == ["enqueued", "started",
                                                              "succeeded"]


def test_a_queue_configured_without_events_writes_none_and_wait_still_works(tmp_path,
                                                                           redis_url, queue):
    sup = start(tmp_path, redis_url, queue, queue_extra="events = false\n")
    with sup:
        assert queue.event_settings()["events"] is False
        assert queue.enqueue("tests.echo", 1).wait(timeout=20) == {"args": [1], "kwargs": {}}
        assert not queue.redis.exists(queue.keys.events)


def test_debounce_runs_once_with_the_last_arguments(tmp_path, redis_url, queue):
    sup = start(tmp_path, redis_url, queue)
    with sup:
        ids = {queue.enqueue("tests.echo", n, key="doc-1", debounce="400ms").id
               for n in range(5)}
        assert len(ids) == 1
        (job_id,) = ids
        assert queue.get(job_id).wait(timeout=20) == {"args": [4], "kwargs": {}}
        assert [e.kind for e in by_job(queue, job_id)].count("started") == 1


def test_key_scope_queued_runs_one_and_keeps_one_waiting(tmp_path, redis_url, queue):
    release = tmp_path / "release"
    sup = start(tmp_path, redis_url, queue)
    with sup:
        running = queue.enqueue("tests.wait_file", str(release), key="sync", key_scope="queued")
        wait_job(queue, running.id, ("active",), timeout=20)
        waiting = [queue.enqueue("tests.echo", n, key="sync", key_scope="queued", replace=True,
                                 delay="200ms")
                   for n in range(3)]
        assert len({j.id for j in waiting}) == 1 and waiting[0].id != running.id
        assert waiting[0].wait(timeout=20) == {"args": [2], "kwargs": {}}
        release.touch()
        running.wait(timeout=20)
        started = [e.job_id for e in queue.events() if e.kind == "started"]
        assert sorted(started) == sorted([running.id, waiting[0].id])


def test_forq_events_follows_a_queue_as_a_user_would(tmp_path, redis_url, queue):
    sup = start(tmp_path, redis_url, queue)
    with sup:
        follower = subprocess.Popen(
            [sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url, "events",
             queue.name, "--follow", "--timeout", "20s", "--json", "--event", "succeeded",
             "--event", "dead"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
            env=dict(os.environ, PYTHONPATH=str(REPO)))
        try:
            ok = queue.enqueue("tests.echo", "hi")
            bad = queue.enqueue("tests.fatal")
            lines = []
            assert follower.stdout is not None
            while len(lines) < 2:
                line = follower.stdout.readline()
                assert line, f"forq events ended: {follower.stderr.read() if follower.stderr else ''}"
                lines.append(json.loads(line))
        finally:
            follower.terminate()
            follower.wait(timeout=10)
        assert {(x["id"], x["event"]) for x in lines} == {(ok.id, "succeeded"), (bad.id, "dead")}
        assert all(x["queue"] == queue.name and x["task"].startswith("tests.") for x in lines)
