"""Prometheus metrics for the supervisor parent (served by `metrics_server`).

Why a private :class:`~prometheus_client.CollectorRegistry`: the global
registry is shared with whatever a job handler module imports at preload
time; a handler registering its own metrics there would either collide with
ours or leak into our scrape. Children never touch this registry at all
(their counts would die with the child); the parent records everything
through :class:`Metrics` when it learns what a child did.

Queue depths are not tracked incrementally (other supervisors and producers
change them too); they are read from Redis at scrape time through the
``depth_reader`` callable, see :class:`Metrics`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from forq.supervisor.observe.depths import DEPTH_STATES, DepthCollector, DepthReader
from forq.supervisor.observe.metrics_cost import CostMetrics

__all__ = [
    "DEPTH_STATES",
    "DURATION_BUCKETS",
    "OUTCOMES",
    "RSS_BUCKETS",
    "WAIT_BUCKETS",
    "DepthReader",
    "Metrics",
]

log = logging.getLogger(__name__)

#: Every way a job attempt can end, as seen by the parent. Anything else is a
#: programming error in the supervisor and is rejected (unbounded label values
#: are how a metrics endpoint eats a Prometheus server). One attempt gets
#: exactly one outcome; the most specific cause wins: a child killed for its
#: time limit is "timeout" whether or not the job will be retried.
OUTCOMES: frozenset[str] = frozenset(
    {
        "succeeded",  # handler returned, ack accepted
        "retried",  # handler raised, `fail` rescheduled the job with backoff
        "dead",  # `fail`/`reclaim` dead-lettered it (no retries left, unknown task, ...)
        "failed",  # handler raised but the follow-up state is unknown (e.g. Redis error)
        "timeout",  # killed for exceeding its time limit
        "memory",  # killed for exceeding its memory limit
        "crashed",  # died without a result (signal, os._exit, OOM killer) -> `expire`
        "lease_lost",  # fenced: the lease was no longer ours, result dropped
        "released",  # lease given back unfinished during a drain
        "cancelled",  # stopped on request
        "snoozed",  # the handler's own `raise Retry(...)`: rescheduled on its terms
        "throttled",  # the handler throttled its queue or group: the job back to wait
    }
)

#: Job run time: from a few ms (fork + trivial handler) to an hour.
DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)

#: Time from "due" to "claimed": pick-up latency is milliseconds when idle,
#: backlog can make it hours. This is the histogram the queue-age alert reads.
WAIT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
)

_MIB = 1024 * 1024
#: Peak RSS of a child's process tree: powers of two from 1 MiB to 4 GiB.
RSS_BUCKETS: tuple[float, ...] = tuple(float(_MIB * 2**i) for i in range(13))

class Metrics:
    """All supervisor metrics, in one private registry.

    ``depth_reader`` is called on every scrape (at most once per
    ``depth_cache_seconds`` when that is > 0) and must return
    ``{queue: {state: count}}`` for the states in :data:`DEPTH_STATES`.
    It runs inside the supervisor's event loop, so it should cost one
    pipelined Redis round trip and use a short socket timeout. If it
    raises, the scrape still succeeds without ``forq_queue_jobs`` samples
    and ``forq_redis_errors_total{op="scrape"}`` goes up. It can also be
    set later via :attr:`depth_reader` (the Redis client may be built after
    the metrics).
    """

    def __init__(
        self,
        depth_reader: DepthReader | None = None,
        *,
        name: str = "forq",
        version: str | None = None,
        depth_cache_seconds: float = 0.0,
        process_metrics: bool = True,
    ) -> None:
        """Create the registry and every metric.

        ``name`` and ``version`` label ``forq_supervisor_info``; ``name`` is
        the supervisor's configured name (the systemd instance, say), so
        dashboards can tell machines' configs apart. ``process_metrics``
        adds the standard ``process_*`` metrics of the parent (its RSS is
        worth watching: fork cost grows with it).
        """
        self.registry = CollectorRegistry()
        r = self.registry

        # Registered first so that a reader failure is already counted in
        # forq_redis_errors_total within the same scrape.
        self._depth = DepthCollector(
            depth_reader, lambda: self.redis_error("scrape"), depth_cache_seconds
        )
        r.register(self._depth)

        self.jobs_started = Counter(
            "forq_jobs_started_total",
            "Job attempts started (children forked), by queue and task.",
            ["queue", "task"],
            registry=r,
        )
        self.jobs_finished = Counter(
            "forq_jobs_finished_total",
            "Job attempts finished, by queue, task and outcome.",
            ["queue", "task", "outcome"],
            registry=r,
        )
        self.job_duration = Histogram(
            "forq_job_duration_seconds",
            "Wall time of a job attempt, from fork to child exit.",
            ["queue", "task"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.job_wait = Histogram(
            "forq_job_wait_seconds",
            "Time a job waited between becoming due and being claimed.",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.child_peak_rss = Histogram(
            "forq_child_peak_rss_bytes",
            "Peak resident memory of a job child's process tree.",
            ["queue", "task"],
            buckets=RSS_BUCKETS,
            registry=r,
        )
        self.cost = CostMetrics(r)  # forq_job_cpu_seconds, forq_job_peak_memory_bytes, ...
        self.children_running = Gauge(
            "forq_children_running",
            "Job children currently running on this supervisor.",
            ["queue"],
            registry=r,
        )
        self.held = Gauge(
            "forq_jobs_held",
            "Jobs leased ahead of a free slot (the queue's prefetch), not started yet.",
            ["queue"],
            registry=r,
        )
        self.slots = Gauge(
            "forq_slots",
            "Configured concurrency (child slots) per queue on this supervisor.",
            ["queue"],
            registry=r,
        )
        self.lease_extensions = Counter(
            "forq_lease_extensions_total",
            "Leases successfully extended by the lease keeper.",
            registry=r,
        )
        self.steps_recorded = Counter(
            "forq_steps_recorded_total",
            "Durable steps (current().step) sent to Redis: ok, or lost (the lease was not ours).",
            ["queue", "outcome"],
            registry=r,
        )
        self.progress_writes = Counter(
            "forq_progress_writes_total",
            "Progress reports (current().progress) written to Redis, after the child's throttle.",
            ["queue"],
            registry=r,
        )
        self.reclaimed_jobs = Counter(
            "forq_reclaimed_total",
            "Expired leases reclaimed by this supervisor's reaper.",
            ["queue"],
            registry=r,
        )
        self.redis_errors = Counter(
            "forq_redis_errors_total",
            "Redis operations that failed, by operation.",
            ["op"],
            registry=r,
        )
        self.shard_down = Gauge(
            "forq_redis_shard_down",
            "1 while a Redis Cluster shard (host:port) does not answer this supervisor: "
            "its queues are not served and their running jobs are fenced; 0 once it does.",
            ["shard"],
            registry=r,
        )
        # set by the depth reader at each scrape (before this gauge is collected)
        self.task_tripped = Gauge(
            "forq_task_tripped",
            "1 while a task's circuit breaker has it tripped: its jobs parked on every "
            "supervisor until `forq resume QUEUE --task T` or its cool-down.",
            ["queue", "task"],
            registry=r,
        )
        self._tripped: dict[str, set[str]] = {}
        self.info = Gauge(
            "forq_supervisor_info",
            "Always 1; labels identify the supervisor config and forq version.",
            ["name", "version"],
            registry=r,
        )
        self.info.labels(name=name, version=version or _forq_version()).set(1)
        if process_metrics:
            ProcessCollector(registry=r)

    # -- configuration ---------------------------------------------------

    @property
    def depth_reader(self) -> DepthReader | None:
        """The callable feeding ``forq_queue_jobs`` (None: no depth samples)."""
        return self._depth.reader

    @depth_reader.setter
    def depth_reader(self, reader: DepthReader | None) -> None:
        self._depth.reader = reader

    def declare_queue(self, queue: str, slots: int) -> None:
        """Publish a queue at start-up: slots set, zero children, zero reclaims.

        Why: a series that does not exist yet makes ``rate()`` and
        ``absent()`` lie until the first event; declaring the queue makes
        every per-queue panel and alert work from the first scrape.
        """
        self.slots.labels(queue=queue).set(slots)
        self.children_running.labels(queue=queue).set(0)
        self.held.labels(queue=queue).set(0)
        self.reclaimed_jobs.labels(queue=queue)

    # -- events the supervisor reports -------------------------------------

    def job_started(self, queue: str, task: str, wait_seconds: float | None) -> None:
        """A child was forked for a claimed job that waited ``wait_seconds``.

        ``wait_seconds`` is "claimed at" minus "due at" (both Redis ``TIME``);
        None skips the wait histogram (e.g. unknown due time). Negative
        values (clock skew) are clamped to 0.
        """
        self.jobs_started.labels(queue=queue, task=task).inc()
        if wait_seconds is not None:
            self.job_wait.labels(queue=queue).observe(max(0.0, wait_seconds))

    def job_finished(
        self,
        queue: str,
        task: str,
        outcome: str,
        duration_seconds: float | None,
        peak_rss_bytes: int | None,
    ) -> None:
        """A job attempt ended with ``outcome`` (one of :data:`OUTCOMES`).

        Raises ValueError for an unknown outcome: label values must stay a
        closed set, and a typo should fail tests, not invent a series.
        ``duration_seconds``/``peak_rss_bytes`` of None are not observed
        (e.g. a lease released before the child was measured).
        """
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown job outcome {outcome!r}; expected one of {sorted(OUTCOMES)}")
        self.jobs_finished.labels(queue=queue, task=task, outcome=outcome).inc()
        if duration_seconds is not None:
            self.job_duration.labels(queue=queue, task=task).observe(max(0.0, duration_seconds))
        if peak_rss_bytes is not None:
            self.child_peak_rss.labels(queue=queue, task=task).observe(max(0, peak_rss_bytes))

    def set_children(self, queue: str, running: int) -> None:
        """Number of children of ``queue`` alive right now."""
        self.children_running.labels(queue=queue).set(running)

    def set_held(self, queue: str, held: int) -> None:
        """Jobs of ``queue`` leased ahead of a free slot (`supervisor/leases/held.py`)."""
        self.held.labels(queue=queue).set(held)

    def set_slots(self, queue: str, n: int) -> None:
        """Configured concurrency of ``queue`` (0 while draining is a valid choice)."""
        self.slots.labels(queue=queue).set(n)

    def lease_extended(self, n: int = 1) -> None:
        """``n`` leases were extended by one batched call."""
        if n > 0:
            self.lease_extensions.inc(n)

    def step_recorded(self, queue: str, ok: bool) -> None:
        self.steps_recorded.labels(queue=queue, outcome="ok" if ok else "lost").inc()

    def progress_written(self, queue: str, n: int = 1) -> None:
        if n > 0:
            self.progress_writes.labels(queue=queue).inc(n)

    def reclaimed(self, queue: str, n: int = 1) -> None:
        """The reaper moved ``n`` expired leases of ``queue`` back (or to dead)."""
        child = self.reclaimed_jobs.labels(queue=queue)
        if n > 0:
            child.inc(n)

    def set_tripped(self, queue: str, tasks: Iterable[str]) -> None:
        """The queue's tripped tasks now: 1 each, the series of those resumed removed."""
        now = set(tasks)
        for task in self._tripped.get(queue, set()) - now:
            self.task_tripped.remove(queue, task)
        for task in now:
            self.task_tripped.labels(queue=queue, task=task).set(1)
        self._tripped[queue] = now

    def redis_error(self, op: str) -> None:
        """A Redis call for operation ``op`` failed (claim, extend, ack, reclaim, scrape, ...)."""
        self.redis_errors.labels(op=op).inc()

    def shard_state(self, shard: str, down: bool) -> None:
        """A Redis Cluster shard stopped answering (`down`), or answers again."""
        self.shard_down.labels(shard=shard).set(1 if down else 0)

    # -- exposition ----------------------------------------------------------

    def render(self) -> bytes:
        """The text exposition of the registry, exactly what ``GET /metrics`` returns."""
        return generate_latest(self.registry)


def _forq_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - stdlib since 3.8
        return "unknown"
    try:
        return version("forq")
    except PackageNotFoundError:
        return "unknown"
