"""Long tests that mostly run elsewhere, started when the session starts and judged at
its end.

The VM tests (tests/vm.py) spend minutes in a virtual machine under software emulation,
while the rest of the suite, serial, leaves one of the two cores idle most of the time. A
test marked ``@pytest.mark.background(start, lane="vm")`` names a function that does its
slow part and returns what the test judges; conftest starts the selected ones when
collection ends, each lane in its own thread (one lane's work one after the other), and
moves the tests to the end of the run, where each calls ``result(start)``. An exception
in `start` (a skip included) is raised in its test. Run alone, the test starts it then.

What runs in a lane must yield the CPU to the suite: the VM runs at nice 10 (tests/vm.py),
so the suite's timing is what it is alone, and the VM takes what the suite leaves.
Not for what must itself keep time on a loaded host: a soak beside the suite judged its
leaking supervisor `unclear` (its leak grows with the jobs it runs), so it stays in line.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psutil
import pytest

_lanes: dict[str, ThreadPoolExecutor] = {}
_started: dict[Callable[[], Any], Future] = {}
_lock = threading.Lock()


def start(fn: Callable[[], Any], lane: str) -> None:
    with _lock:
        if fn in _started:
            return
        if lane not in _lanes:
            _lanes[lane] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"bg-{lane}")
        _started[fn] = _lanes[lane].submit(fn)


def result(fn: Callable[[], Any], lane: str = "own") -> Any:
    start(fn, lane)
    return _started[fn].result()


def last(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items with the marked ones moved to the end, in their order."""
    marked = [item for item in items if item.get_closest_marker("background")]
    return [item for item in items if item not in marked] + marked


def start_marked(items: list[pytest.Item]) -> None:
    """Start the work of every marked item that was selected."""
    for item in items:
        marker = item.get_closest_marker("background")
        if marker is not None:
            start(marker.args[0], marker.kwargs.get("lane", item.nodeid))


def stop_unfinished() -> None:
    """A session that ends early (-x, Ctrl-C) leaves no VM or soak behind: kill what the
    lanes' threads started, so their futures end and no process outlives the run."""
    if all(f.done() for f in _started.values()):
        return
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass
    for pool in _lanes.values():
        pool.shutdown(wait=True, cancel_futures=True)
