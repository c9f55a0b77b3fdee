"""A heap of one-shot timers for a single-threaded event loop, and `Ticker`: a
repeating one that slows down while it has nothing to watch."""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable

# A ticker's period while its `idle` predicate holds: an idle supervisor wakes a few
# times a second, not 20 times per fast ticker (issue 27: idle CPU ≈ 0)
IDLE_INTERVAL = 1.0


class Timers:
    """Callbacks due at monotonic times. `schedule` returns a handle; cancelling marks
    it dead (a heap removal would cost O(n); a dead entry costs one pop later)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, list]] = []
        self._seq = itertools.count()
        self.fired = 0  # callbacks run, ever: what an idle loop's wake-ups are made of

    def schedule(self, delay: float, callback: Callable[[], None]) -> list:
        entry = [callback]
        heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay), next(self._seq), entry))
        return entry

    def every(self, interval: float, callback: Callable[[], object], *,
              idle: Callable[[], bool] | None = None,
              idle_interval: float = IDLE_INTERVAL) -> Ticker:
        """Call `callback` every `interval` seconds from now on; one that raises is
        still re-armed (the loop's caller sees the error, the period goes on). With
        `idle`: every `idle_interval` instead while `idle()` holds after a call, until
        `Ticker.hurry` (see there)."""
        return Ticker(self, interval, callback, idle, idle_interval)

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
                self.fired += 1
                callback()


class Ticker:
    """A repeating timer. After each call it asks `idle()`: true, the next call is
    `idle_interval` away (never sooner than `interval`), else `interval`. Whatever
    ends its idleness calls `hurry()` (a child launched: its limits are due within
    `interval` of its start, not within the slow period)."""

    def __init__(self, timers: Timers, interval: float, callback: Callable[[], object],
                 idle: Callable[[], bool] | None = None,
                 idle_interval: float = IDLE_INTERVAL) -> None:
        self.timers = timers
        self.interval = interval
        self.idle_interval = max(interval, idle_interval)
        self.callback = callback
        self.idle = idle
        self.handle: list | None = None
        self.due = 0.0  # monotonic time of the next call
        self._arm(interval)

    @property
    def slow(self) -> bool:
        """The next call is further away than `interval` (it ticks at its idle pace)."""
        return self.due - time.monotonic() > self.interval

    def hurry(self) -> None:
        """The next call within `interval` from now (and at that pace after it, for as
        long as `idle()` does not hold)."""
        if self.slow:
            Timers.cancel(self.handle)
            self._arm(self.interval)

    def _arm(self, delay: float) -> None:
        self.due = time.monotonic() + delay
        self.handle = self.timers.schedule(delay, self._tick)

    def _tick(self) -> None:
        try:
            self.callback()
        finally:
            slow = self.idle is not None and self.idle()
            self._arm(self.idle_interval if slow else self.interval)
