"""Wait on a condition with a deadline — never a bare sleep — and stop a process within
one."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01,
             message: str = "condition") -> T:
    """Poll `predicate` until it returns a truthy value (returned) or the deadline
    passes (AssertionError naming `message`)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def wait_job(queue: Any, job_id: str, states: tuple[str, ...], timeout: float = 20.0,
             context: Callable[[], str] = lambda: "") -> Any:
    """Wait until the job is in one of `states` and return it; on timeout, say where it
    was (state, history) plus `context()`, e.g. the supervisors' logs."""
    from forq import JobNotFound

    last: list[Any] = []

    def check() -> Any:
        try:
            job = queue.get(job_id)
        except JobNotFound:
            return None
        last[:] = [job]
        return job if job.state in states else None

    try:
        return wait_for(check, timeout=timeout, interval=0.02,
                        message=f"job {job_id} to reach {states}")
    except AssertionError:
        job = last[0] if last else None
        detail = f"state {job.state!r}, history {job.history}" if job else "no record"
        raise AssertionError(f"job {job_id} never reached {states}: {detail}\n"
                             f"{context()}") from None


def stop_process(proc: subprocess.Popen | None, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after `grace` seconds; reaped either
    way (a test never leaves a process behind, nor waits on one forever)."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)
