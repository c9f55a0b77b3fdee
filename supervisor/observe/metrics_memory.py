"""Admission by memory for Prometheus (`[supervisor] memory_budget`,
`children.budget`): the budget, the memory limits it has admitted (running children, and
held jobs leased here that will start), the jobs a free slot found no room for, and the
jobs refused as over the whole budget.

Read from the children's table when scraped (a `MemorySnapshot`), like the queue depths:
the figures change at every child's start and end, and only matter when someone looks.
Without a budget the scrape has none of these samples (`absent()` in an alert says so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger("forq.supervisor.observe.metrics")


@dataclass
class MemorySnapshot:
    budget: int | None  # bytes; None: no admission by memory
    running: int = 0  # what the running children count against the budget
    held: int = 0  # what the held jobs will count when they start
    waiting: Mapping[str, int] = field(default_factory=dict)  # queue -> jobs waiting for room
    refused: int = 0  # jobs refused as over the whole budget since the start


class MemoryCollector:
    """forq_memory_budget_bytes, forq_memory_admitted_bytes{state},
    forq_jobs_waiting_for_memory{queue}, forq_memory_refused_total."""

    def __init__(self, reader: Callable[[], MemorySnapshot]) -> None:
        self.reader = reader

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily,
                                 CounterMetricFamily]:
        return (
            GaugeMetricFamily(
                "forq_memory_budget_bytes",
                "This supervisor's [supervisor] memory_budget (absent: none)."),
            GaugeMetricFamily(
                "forq_memory_admitted_bytes",
                "Memory limits counted against the budget: of the running children "
                "(state=running), and of jobs held here that will start (state=held).",
                labels=["state"]),
            GaugeMetricFamily(
                "forq_jobs_waiting_for_memory",
                "Jobs leased here that a free slot found no room for in the memory budget.",
                labels=["queue"]),
            CounterMetricFamily(
                "forq_memory_refused",
                "Jobs refused (snoozed) because their memory_limit is over the whole budget."),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()  # declares the names without reading the table

    def collect(self) -> Iterable[Metric]:
        try:
            snap = self.reader()
        except Exception:  # a scrape must survive anything; the other metrics still count
            log.debug("memory snapshot failed; skipping the memory budget's metrics",
                      exc_info=True)
            return
        if snap.budget is None:
            return
        budget, admitted, waiting, refused = self._families()
        budget.add_metric([], float(snap.budget))
        admitted.add_metric(["running"], float(snap.running))
        admitted.add_metric(["held"], float(snap.held))
        for queue in sorted(snap.waiting):
            waiting.add_metric([queue], float(snap.waiting[queue]))
        refused.add_metric([], float(snap.refused))
        yield from (budget, admitted, waiting, refused)
