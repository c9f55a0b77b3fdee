"""``forq_queue_jobs{queue,state}``: queue depths, read from Redis when scraped.

Queue depths are not tracked incrementally (other supervisors and producers change
them too); they are read at scrape time through a ``depth_reader`` callable given to
`metrics.Metrics`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

log = logging.getLogger("forq.supervisor.observe.metrics")

#: The states ``forq_queue_jobs`` reports, in exposition order.
DEPTH_STATES: tuple[str, ...] = ("pending", "scheduled", "active", "dead")

#: ``depth_reader() -> {queue: {state: count}}``; see :class:`Metrics`.
DepthReader = Callable[[], Mapping[str, Mapping[str, int]]]


class DepthCollector:
    """Custom collector producing ``forq_queue_jobs{queue,state}`` at scrape time.

    Why a collector rather than a Gauge refreshed on a timer: depths are
    only interesting when someone looks, and reading them at scrape time
    costs one pipelined Redis round trip per scrape instead of one per tick.
    A failing reader must never fail the scrape (that would hide all the
    other metrics exactly when Redis is in trouble), so errors drop the
    depth samples and count ``forq_redis_errors_total{op="scrape"}``.
    """

    def __init__(
        self,
        reader: DepthReader | None,
        on_error: Callable[[], None],
        cache_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        self._on_error = on_error
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._cached: list[tuple[str, str, float]] | None = None
        self._cached_at = 0.0

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "forq_queue_jobs",
            "Jobs per queue and state, read from Redis at scrape time.",
            labels=["queue", "state"],
        )

    def describe(self) -> Iterable[Metric]:
        # Declares the name so the registry rejects a clashing collector,
        # without calling the reader at registration time.
        return [self._family()]

    def _read(self) -> list[tuple[str, str, float]] | None:
        now = self._clock()
        if self._cached is not None and now - self._cached_at < self._cache_seconds:
            return self._cached
        if self.reader is None:
            return None
        try:
            depths = self.reader()
            samples: list[tuple[str, str, float]] = []
            for queue in sorted(depths):
                states = depths[queue]
                ordered = [s for s in DEPTH_STATES if s in states]
                ordered += sorted(s for s in states if s not in DEPTH_STATES)
                for state in ordered:
                    samples.append((str(queue), str(state), float(states[state])))
        except Exception:  # a scrape must survive any reader failure
            log.debug("depth_reader failed; skipping forq_queue_jobs", exc_info=True)
            self._on_error()
            self._cached = None
            return None
        self._cached = samples
        self._cached_at = now
        return samples

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        samples = self._read()
        if samples:
            for queue, state, value in samples:
                family.add_metric([queue, state], value)
        yield family
