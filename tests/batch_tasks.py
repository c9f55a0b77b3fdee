"""Handlers for the batch and dependency tests (tests/test_batches.py) and chaos.

Each appends a line to a file outside Redis per execution, so a test counts runs
(a callback that ran twice would show twice) without asking forq.
"""

from __future__ import annotations

import os
import signal
import time

from forq import NonRetryable, current, task


def _note(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@task("batch.work")
def work(i: int, mode: str = "ok", path: str = "") -> int:
    """A member: "ok" returns i; "fail" is dead at once; "crash" exits without a result
    every time (dead after max_crashes); "crash_once" / "kill_once" exit / SIGKILL
    themselves on the first run and succeed on the next."""
    if path:
        _note(path, f"{current().id} {mode}")
    first = current().crashes == 0 and current().attempts == 0
    if mode == "fail":
        raise NonRetryable(f"member {i} fails")
    if mode == "crash" or (mode == "crash_once" and first):
        os._exit(3)
    if mode == "kill_once" and first:
        os.kill(os.getpid(), signal.SIGKILL)
    return i


@task("batch.callback")
def callback(path: str, kind: str, batch_id: str) -> str:
    """A batch's callback: one line per run, naming the batch and which callback."""
    _note(path, f"{batch_id} {kind}")
    return batch_id


@task("batch.open")
def open_batch(n: int, path: str, other_queue: str = "", fail: int = -1,
               sleep: float = 0) -> str:
    """A job that opens a batch of `n` members from its handler (member `fail` fails;
    odd members on `other_queue` when given), with an on_complete callback; it returns
    `sleep` seconds after opening it."""
    jobs = [{"task": "batch.work", "args": [i, "fail" if i == fail else "ok", path],
             **({"queue": other_queue} if other_queue and i % 2 else {})}
            for i in range(n)]
    opened = current().batch(
        jobs, on_complete={"task": "batch.callback", "kwargs": {"path": path, "kind": "inner"}})
    time.sleep(sleep)
    return opened
