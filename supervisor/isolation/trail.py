"""MemoryTrail: a child's memory in its last seconds, for the death report.

A job that was killed for its memory, crashed or timed out leaves more to start from
than its peak: how fast it grew, and whether it had leveled off. The police's samples
(every `memory_sample_interval`) are kept for the last `SECONDS` in a bounded ring, and
the report keeps at most `KEPT` of them, spread over that window, as
`[[seconds before the end, bytes], ...]` (oldest first) in the job record's
`memory_trail` field, beside its output and its reason (`forq job ID`, the dashboard).
"""

from __future__ import annotations

import json
from collections import deque

SECONDS = 10.0  # how far back a death report looks
KEPT = 16  # samples a report keeps, at most
RING = 512  # samples held per child, at most (at 20 ms a sample, the last 10 s)


class MemoryTrail:
    __slots__ = ("_samples",)

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque(maxlen=RING)

    def add(self, at: float, rss: int) -> None:
        """A sample of `rss` bytes taken at `at` (monotonic seconds)."""
        self._samples.append((at, rss))

    def report(self, end: float) -> list[list[float | int]]:
        """The samples of the last SECONDS before `end`, at most KEPT spread evenly (the
        newest always in), as [seconds before `end`, bytes]."""
        recent = [(at, rss) for at, rss in self._samples if at >= end - SECONDS]
        if len(recent) > KEPT:
            step = (len(recent) - 1) / (KEPT - 1)
            recent = [recent[round(i * step)] for i in range(KEPT)]
        return [[round(max(0.0, end - at), 3), rss] for at, rss in recent]

    def json(self, end: float) -> str:
        """`report` as the record keeps it; "" when there is no sample."""
        kept = self.report(end)
        return json.dumps(kept, separators=(",", ":")) if kept else ""
