"""Handlers for tests/test_replay.py: a job that prints, takes a step and fails; one
that sleeps past its time limit."""

from __future__ import annotations

import os
import time
from pathlib import Path

from forq import current, task


def _count(path: str) -> int:
    """The step's side effect: one line more in `path` per call."""
    with open(path, "a") as f:
        f.write("charged\n")
    return len(Path(path).read_text().splitlines())


@task("replay.charge_then_fail")
def charge_then_fail(marks: str) -> None:
    print(f"hello from the handler in pid {os.getpid()}", flush=True)
    charged = current().step("charge", _count, marks)
    raise ValueError(f"refused after charge {charged}")


@task("replay.sleep")
def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
