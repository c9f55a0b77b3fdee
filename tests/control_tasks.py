"""Handlers of tests/test_handler_control.py: a handler's own retry (`Retry`), its
throttle of its queue or group, and its parents' results; each run marked in a file (a
child holds no Redis connection)."""

from __future__ import annotations

import datetime
import time

from forq import Retry, current, task


def _mark(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line + "\n")


def _runs(path: str) -> int:
    try:
        with open(path) as f:
            return len(f.read().split())
    except FileNotFoundError:
        return 0


@task("control.snooze")
def snooze(runs: str, times: int, delay: float = 0.2, counted: bool = False,
           at: bool = False):
    """Put itself off `times` times (`Retry`, by `in_` or by `at`), then succeed."""
    n = _runs(runs)
    _mark(runs, f"{time.time():.3f}")
    if n < times:
        if at:
            raise Retry(at=datetime.datetime.now() + datetime.timedelta(seconds=delay),
                        counted=counted, reason=f"not yet ({n + 1})")
        raise Retry(in_=delay, counted=counted, reason=f"not yet ({n + 1})")
    return {"runs": n + 1, "attempts": current().attempts}


@task("control.async_snooze")
async def async_snooze(runs: str, times: int):
    n = _runs(runs)
    _mark(runs, f"{time.time():.3f}")
    if n < times:
        raise Retry("100ms")
    return n + 1


@task("control.throttle")
def throttle(runs: str, duration: str, group: bool = False, times: int = 1):
    """Throttle its queue (or group) for `duration` on its first `times` runs, then
    succeed; each run marked with its time."""
    n = _runs(runs)
    _mark(runs, f"{time.time():.3f}")
    if n < times:
        current().throttle(duration, group=group, reason="429 from upstream")
    return n + 1


@task("control.swallow_throttle")
def swallow_throttle(runs: str):
    """Catches Exception around its throttle: the throttle still ends the run."""
    n = _runs(runs)
    _mark(runs, f"{time.time():.3f}")
    if n == 0:
        try:
            current().throttle("200ms")
        except Exception:  # noqa: BLE001 — the point of the test
            return "swallowed"
    return n + 1


@task("control.mark")
def mark(runs: str, value: object = None):
    """Mark its start time; return `value`."""
    _mark(runs, f"{time.time():.3f}")
    return value
