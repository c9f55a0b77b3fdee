"""What the harness's threads share: settings, processes, and the recorded history
that the checker reads (told jobs, faults, Redis outages, monitor findings)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .procs import RedisProc, SupervisorProc

QUEUE = "chaos"
# a second queue the supervisors serve: a batch member there ends through its queue's
# relay, which every reaper pass delivers to the batch (lua/batch_relay.lua)
OTHER_QUEUE = "chaos-b"
OTHER_CONCURRENCY = 2


@dataclass
class Settings:
    duration: float = 75.0
    supervisors: int = 3
    concurrency: int = 6
    jobs: int | None = None
    rate: float | None = None
    seed: int = 0
    lease_ttl: float = 2.0
    reaper_interval: float = 0.25
    drain_timeout: float = 1.5
    max_attempts: int = 3
    max_crashes: int = 4
    tolerance: float = 1.0  # slack on the supervisor-death reclaim bound
    child_bound: float = 1.0  # a child crash is back in pending within this
    settle: float = 60.0  # bound on the wait for quiescence
    min_each: int = 2  # every fault kind at least this often
    faults: tuple[str, ...] = ()  # fault kinds to inject (all when empty)
    breaks: tuple[str, ...] = ()
    report: str | None = None
    keep: bool = False
    quiet: bool = False
    job_cgroups: bool = False  # supervisors in cgroups of their own, job_cgroups = "required"
    namespaces: bool = False  # [sandbox].namespaces = true: every job PID 1 of its own
    # the circuit breaker per task (docs/guide/breaker.md): on, as by default, with a
    # cool-down short enough that a tripped task's parked jobs run within the settle
    # bound (chaos.fatal's jobs all fail alike: it trips); "" off
    breaker_cooldown: str = "2s"
    prefetch: int = 0  # the odd-numbered supervisors' [[queue]].prefetch (a mixed fleet)
    # chaos.slow jobs run this long (ms): past lease_ttl, so a stopped supervisor's child
    # would still run when its job is re-run elsewhere, were it not fenced
    slow_ms: tuple[float, float] = (300.0, 3000.0)
    # the share of batches with a member that opens a batch of its own (current().batch)
    nested_batches: float = 0.3
    soak: bool = False  # sample memory and fds and judge their slopes (chaos/soak.py)
    sample_interval: float = 60.0
    warmup: float = 0.0  # s of each process's life not judged (soak)

    @property
    def reclaim_bound(self) -> float:
        return self.lease_ttl + self.reaper_interval + self.tolerance

    def breaker_line(self) -> str:
        """The supervisors' [defaults] line of the circuit breaker per task."""
        if not self.breaker_cooldown:
            return "breaker = { failures = 0 }"
        return f'breaker = {{ cooldown = "{self.breaker_cooldown}" }}'

    def total_jobs(self) -> int:
        if self.jobs is not None:
            return self.jobs
        return int(round((self.rate or 35.0) * self.duration))

    def job_rate(self) -> float:
        if self.rate is not None:
            return self.rate
        if self.jobs is not None:
            return max(0.1, self.jobs / self.duration)
        return 35.0


@dataclass
class Told:
    """A job whose enqueue returned an id: the producer was told it is enqueued."""

    id: str
    kind: str
    task: str
    # "succeed" | "dead:attempts" | "dead:crashes" | "dead:fatal" | "dead:memory" |
    # "dead:snoozes"
    expect: str
    idempotent: bool
    max_attempts: int
    max_crashes: int
    told_at: float
    tries: int = 1
    status: str = ""  # pending | duplicate (an earlier try had landed) | dropped (broken mode)
    batch: str = ""  # the batch it is a member or a callback of
    queue: str = QUEUE
    # told conditionally: a batch's on_success is enqueued only if every member succeeded,
    # so its absence is not a loss (invariant 10 decides whether it should exist)
    optional: bool = False


@dataclass
class Context:
    settings: Settings
    workdir: Path
    exec_log: Path
    redis: RedisProc
    supervisors: list[SupervisorProc]
    started: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock)
    told: dict[str, Told] = field(default_factory=dict)
    not_told: dict[str, int] = field(default_factory=dict)  # id -> failed tries, never told
    enqueue_errors: int = 0
    faults: list[dict[str, Any]] = field(default_factory=list)
    redis_outages: list[list[float]] = field(default_factory=list)  # [start, end]
    redis_slow: list[list[float]] = field(default_factory=list)  # measured: PING > 250 ms
    monitor_violations: list[dict[str, Any]] = field(default_factory=list)
    unexpected_exits: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    # supervisor pid -> one series per process (pids recycle) of (wall time, seconds
    # spent runnable but not running), from /proc/PID/schedstat: how much a noisy
    # host starved it of CPU, and when
    sched: dict[int, list[list[tuple[float, float]]]] = field(default_factory=dict)
    cpu_pressure: list[tuple[float, float]] = field(default_factory=list)  # (t, PSI some avg10)
    stop: threading.Event = field(default_factory=threading.Event)
    production_done: threading.Event = field(default_factory=threading.Event)
    faults_done: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)  # harness problems (not invariants)
    operator: dict[str, int] = field(default_factory=dict)  # what chaos/changes.py did
    # each debounced enqueue that returned, in the order sent: [key, v, id returned, status]
    debounce_calls: list[list[Any]] = field(default_factory=list)
    # retention trims ended records (a soak's after its window, any run's past the default
    # counts): the monitor copies each one as it enters the retention index (id ->
    # (queue, record, history)), so the checker still reads the story of a job whose
    # record is gone by the end
    kept: dict[str, tuple[str, dict[str, str], list[str]]] = field(default_factory=dict)

    def log(self, message: str) -> None:
        if not self.settings.quiet:
            print(f"[{time.time() - self.started:7.2f}s] {message}", flush=True)

    def add_told(self, told: Told) -> None:
        with self.lock:
            self.told[told.id] = told
            self.not_told.pop(told.id, None)

    def dead_supervisors(self) -> dict[str, float]:
        """Supervisor id -> when its process ended, for every ended incarnation."""
        out: dict[str, float] = {}
        incs = sorted((inc for sup in self.supervisors for inc in list(sup.incarnations)),
                      key=lambda inc: inc.started)
        for inc in incs:  # pids recycle: a live process with a dead one's id is alive
            if inc.ended is not None:
                out[inc.sup_id] = inc.ended
            else:
                out.pop(inc.sup_id, None)
        return out
