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


@task("control.parents")
def parents(batch_id: str = ""):
    """What a dependent or a batch callback reads of its parents (twice: the second
    read is the run's copy, no new request)."""
    first = current().parents()
    assert current().parents() == first
    return {"results": current().parent_results(),
            "parents": [[p.id, p.queue, p.state, p.result, p.reason] for p in first]}


@task("control.async_parents")
async def async_parents(batch_id: str = ""):
    return {"results": await current().aparent_results(),
            "states": [p.state for p in await current().aparents()]}


@task("control.parent_sizes")
def parent_sizes(batch_id: str = ""):
    """Only the sizes of what it read (the results themselves may be megabytes)."""
    return {p.id: len(json_text(p.result)) for p in current().parents()}


def json_text(value: object) -> str:
    import json

    return json.dumps(value)


@task("control.blob")
def blob(size: int, tag: str = ""):
    """A result of about `size` bytes."""
    return tag + "x" * size


@task("control.ask_and_sleep")
def ask_and_sleep(seconds: float):
    """Ask for its parents on the raw channel, then never read the answer."""
    import os

    os.write(3, b'{"t": "parents"}\n')
    time.sleep(seconds)
    return "woke"
