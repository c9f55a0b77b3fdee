"""Handlers of tests/test_steps.py: progress and durable steps, counted in files (a
child holds no Redis connection)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from forq import current, task


def _mark(path: str, line: str) -> str:
    with open(path, "a") as f:
        f.write(line + "\n")
    return line


def _wait_for_file(path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)


@task("steps.three")
def three(runs: str, crash_flag: str):
    """Three steps; the first run SIGKILLs itself after step two (once, by a flag file)."""
    first = current().step("one", _mark, runs, "one")
    second = current().step("two", lambda: {"charged": _mark(runs, "two")})
    if not os.path.exists(crash_flag):
        Path(crash_flag).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    third = current().step("three", _mark, runs, "three")
    return [first, second, third]


@task("steps.async_three")
async def async_three(runs: str, crash_flag: str):
    """`three` as an async handler: a sync step and an async one (`astep`)."""
    async def marked(line: str) -> str:
        return _mark(runs, line)

    first = await current().astep("one", marked, "one")
    second = current().step("two", _mark, runs, "two")
    if not os.path.exists(crash_flag):
        Path(crash_flag).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    third = await current().astep("three", marked, "three")
    return [first, second, third]


@task("steps.held_up")
def held_up(runs: str, go: str):
    """Step one, then step two's function waits for `go` (the test takes the lease away
    meanwhile); writes "after" if it ever gets past step two."""
    current().step("one", _mark, runs, "one")

    def two() -> str:
        _wait_for_file(go)
        return _mark(runs, "two")

    current().step("two", two)
    _mark(runs, "after")
    return "should not get here"


@task("steps.progress")
def progress(go: str):
    """Half way, then wait for `go`, then done."""
    current().progress(0.5, "half way")
    _wait_for_file(go)
    current().progress(1, "done")
    return "ok"


@task("steps.chatty")
def chatty(seconds: float, at_least: int = 100_000):
    """Report progress in a tight loop for `seconds`, and `at_least` times: the child
    throttles it."""
    deadline = time.monotonic() + seconds
    calls = 0
    while time.monotonic() < deadline or calls < at_least:
        calls += 1
        current().progress((calls % 1000) / 1000, f"call {calls}")
    current().progress(1, f"{calls} calls")
    return calls


@task("steps.too_much")
def too_much():
    """Steps of 60 KiB until the job's total is over its cap: the last one raises."""
    for i in range(100):
        current().step(f"big{i}", lambda: "x" * 60_000)
    return "all recorded"


@task("steps.bad_input")
def bad_input():
    """Each mistake a handler can make with progress and steps, and what it raised."""
    said = {}
    for name, attempt in [("over", lambda: current().progress(1.5)),
                          ("nan", lambda: current().progress(float("nan"))),
                          ("text", lambda: current().progress("half")),
                          ("long name", lambda: current().step("x" * 201, int)),
                          ("not json", lambda: current().step("s", object))]:
        try:
            attempt()
            said[name] = "accepted"
        except Exception as exc:  # noqa: BLE001 — the test reads what was raised
            said[name] = f"{type(exc).__name__}: {exc}"
    return said
