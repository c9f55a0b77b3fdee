"""`async def` handlers under a real supervisor: each job still gets its own forked
child (limits, fencing and crash handling unchanged), where `asyncio.run` drives it."""

from __future__ import annotations

import pytest

from tests.helpers import wait_job
from tests.supervisors import SupervisorProcess, write_config

TERMINAL = ("succeeded", "dead", "cancelled")


def _supervisor(tmp_path, redis_url, queue, **options) -> SupervisorProcess:
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 4},
                          imports=("tests.async_tasks",), drain_timeout="1s", **options)
    return SupervisorProcess(config)


def _events(job) -> list[str]:
    return [entry["event"] for entry in job.history]


@pytest.mark.timeout(60)
def test_async_handlers_succeed_fail_and_are_told_apart_from_a_forgotten_await(
        tmp_path, redis_url, queue):
    with _supervisor(tmp_path, redis_url, queue) as sup:
        ok = queue.enqueue("tests.async.echo", 1, "two")
        bad = queue.enqueue("tests.async.fail", "no such mailbox", max_attempts=2)
        forgot = queue.enqueue("tests.async.forgot")

        assert ok.wait(timeout=20) == {"args": [1, "two"], "job": ok.id, "follow": f"{ok.id}-1"}
        follow = wait_job(queue, f"{ok.id}-1", TERMINAL, context=sup.log)
        assert follow.result == {"args": ["follow-up"], "job": follow.id, "follow": None}

        job = wait_job(queue, bad.id, TERMINAL, context=sup.log)
        assert (job.state, job.attempts) == ("dead", 2)
        assert job.reason == "ValueError: no such mailbox (attempts exhausted: 2)"
        assert "raise ValueError(message)" in job.error["traceback"]

        job = wait_job(queue, forgot.id, TERMINAL, context=sup.log)
        assert (job.state, job.attempts) == ("dead", 1)  # non-retryable: a bug, not bad luck
        assert "returned coroutine instead of a result; declare it `async def`" in job.reason
    assert "Traceback" not in sup.log()


@pytest.mark.timeout(90)
def test_async_handlers_keep_the_limits_of_a_child(tmp_path, redis_url, queue):
    with _supervisor(tmp_path, redis_url, queue, lease_ttl="30s", reaper_interval="5s") as sup:
        slow = queue.enqueue("tests.async.sleep", 30, timeout="500ms", max_attempts=1)
        hog = queue.enqueue("tests.async.hog", 200, memory_limit="64MiB", max_attempts=1)
        crash = queue.enqueue("tests.async.segfault", max_crashes=1)

        job = wait_job(queue, slow.id, TERMINAL, timeout=20, context=sup.log)
        assert job.state == "dead" and job.reason.startswith("timeout after 0.5"), job.reason

        job = wait_job(queue, hog.id, TERMINAL, timeout=20, context=sup.log)
        assert job.state == "dead" and job.reason.startswith("memory limit exceeded"), job.reason

        job = wait_job(queue, crash.id, TERMINAL, timeout=20, context=sup.log)
        # reclaimed at once (a 30 s lease), then dead on its only allowed crash
        assert job.state == "dead" and job.crashes == 1, job.history
        assert "killed by SIGSEGV" in job.reason
        assert _events(job) == ["enqueued", "claimed", "crashed", "dead"]
