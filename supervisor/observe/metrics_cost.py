"""What each job attempt cost, per task, for Prometheus: its CPU time and peak memory
(the figures its record keeps, `children.cost`), and its start latency.

Registered in the supervisor's private registry by `metrics.Metrics` (``cost``). One
series per queue and task, like the job counters: task names are the registered
handlers', a closed set.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Histogram

_MIB = 1024 * 1024
#: CPU time of an attempt's process tree: 1 ms to an hour.
CPU_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 900.0, 3600.0,
)
#: Peak memory of an attempt: powers of two from 1 MiB to 16 GiB.
MEMORY_BUCKETS: tuple[float, ...] = tuple(float(_MIB * 2**i) for i in range(15))
#: From the claim to the handler's first line: a fork is milliseconds, an exec'd
#: child's imports or a held job's wait for its slot seconds.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0,
)


class CostMetrics:
    """forq_job_cpu_seconds, forq_job_peak_memory_bytes, forq_job_start_latency_seconds."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.cpu = Histogram(
            "forq_job_cpu_seconds",
            "CPU time (user + system) of a job attempt's whole process tree.",
            ["queue", "task"], buckets=CPU_BUCKETS, registry=registry)
        self.peak_memory = Histogram(
            "forq_job_peak_memory_bytes",
            "Peak memory of a job attempt (its samples' peak, its cgroup's, or ru_maxrss).",
            ["queue", "task"], buckets=MEMORY_BUCKETS, registry=registry)
        self.start_latency = Histogram(
            "forq_job_start_latency_seconds",
            "Time from the claim of a job to its handler's first line.",
            ["queue", "task"], buckets=LATENCY_BUCKETS, registry=registry)

        # each (queue, task)'s three series, looked up once: `labels()` costs more than
        # an observation, and this runs for every job
        self._series: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def observe(self, queue: str, task: str, cpu_seconds: float, peak_bytes: int,
                start_latency: float | None) -> None:
        """One finished attempt's cost (`start_latency` None: not known)."""
        series = self._series.get((queue, task))
        if series is None:
            series = self._series[(queue, task)] = (
                self.cpu.labels(queue=queue, task=task),
                self.peak_memory.labels(queue=queue, task=task),
                self.start_latency.labels(queue=queue, task=task))
        series[0].observe(max(0.0, cpu_seconds))
        series[1].observe(max(0, peak_bytes))
        if start_latency is not None:
            series[2].observe(max(0.0, start_latency))
