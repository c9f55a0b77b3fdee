"""A heap of one-shot timers for a single-threaded event loop."""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable


class Timers:
    """Callbacks due at monotonic times. `schedule` returns a handle; cancelling marks
    it dead (a heap removal would cost O(n); a dead entry costs one pop later)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, list]] = []
        self._seq = itertools.count()

    def schedule(self, delay: float, callback: Callable[[], None]) -> list:
        entry = [callback]
        heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay), next(self._seq), entry))
        return entry

    def every(self, interval: float, callback: Callable[[], object]) -> None:
        """Call `callback` every `interval` seconds from now on; one that raises is
        still re-armed (the loop's caller sees the error, the period goes on)."""
        def tick() -> None:
            try:
                callback()
            finally:
                self.schedule(interval, tick)

        self.schedule(interval, tick)

    @staticmethod
    def cancel(handle: list | None) -> None:
        if handle:
            handle[0] = None

    def timeout(self, cap: float) -> float:
        """Seconds until the next live timer, at most `cap`."""
        while self._heap and self._heap[0][2][0] is None:
            heapq.heappop(self._heap)
        if not self._heap:
            return cap
        return max(0.0, min(cap, self._heap[0][0] - time.monotonic()))

    def run_due(self) -> None:
        now = time.monotonic()
        while self._heap and self._heap[0][0] <= now:
            _, _, entry = heapq.heappop(self._heap)
            callback, entry[0] = entry[0], None
            if callback is not None:
                callback()
