"""Task registration and the handler's view of its own job.

Handlers register with ``@task("images.resize")`` in modules the supervisor
preloads before forking, so the child finds them without importing anything.
"""

from __future__ import annotations

import datetime
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from forq.channel import MAX_SNOOZE_MS, MAX_THROTTLE_MS, Channel, ParentResult
from forq.errors import PayloadError
from forq.payload import build_spec
from forq.store.batchspec import build_batch
from forq.store.keyed import PRODUCER_ONLY
from forq.units import UnitError, parse_duration


class NonRetryable(Exception):
    """Raise from a handler to send the job to dead at once: retrying cannot help."""


def _delay_ms(value: Any, where: str, cap_ms: int) -> int:
    """A duration (seconds, "30s", a timedelta) as ms from 0 to `cap_ms`, or ValueError."""
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    try:
        ms = int(round(parse_duration(value, where=where) * 1000))
    except UnitError as exc:
        raise ValueError(str(exc)) from None
    if ms > cap_ms:
        raise ValueError(f"{where}: {value!r} is over the {cap_ms // 3_600_000} h a handler "
                         "may ask for")
    return ms


class Retry(Exception):
    """Raise from a handler to run the job again later, on the handler's terms.

    ``raise Retry(in_="30s")`` (seconds, a duration string or a timedelta) or
    ``raise Retry(at=when)`` (a datetime or Unix seconds, by this machine's clock): the
    job goes back to scheduled until then (``Retry()``: due at once, behind the jobs
    already pending). Not counted as an attempt unless ``counted=True``; every snooze
    counts against the job's ``max_snoozes`` (default 100), past which it goes to dead.
    At most 30 days ahead. `reason` shows in the job's history."""

    def __init__(self, in_: Any = None, *, at: Any = None, counted: bool = False,
                 reason: str = "") -> None:
        if in_ is not None and at is not None:
            raise ValueError("Retry: give in_ or at, not both")
        if at is not None:
            when = at.timestamp() if hasattr(at, "timestamp") else at
            if isinstance(when, bool) or not isinstance(when, (int, float)):
                raise ValueError(f"Retry: at must be a datetime or Unix seconds, got {at!r}")
            in_ = max(0.0, when - time.time())
        self.delay_ms = _delay_ms(0 if in_ is None else in_, "Retry", MAX_SNOOZE_MS)
        self.counted = bool(counted)
        self.reason = str(reason)
        super().__init__(self.reason or f"retry in {self.delay_ms / 1000:g}s")


class Throttled(BaseException):  # noqa: N818 — a stop, not an error of the handler's
    """Raised by `JobContext.throttle`: this run ends, the job goes back to wait and its
    queue (or group) pauses. A BaseException, so ``except Exception`` in handler code
    does not swallow it."""

    def __init__(self, delay_ms: int, group: bool, reason: str = "") -> None:
        self.delay_ms = delay_ms
        self.group = group
        self.reason = reason
        scope = "group" if group else "queue"
        super().__init__(reason or f"throttled its {scope} for {delay_ms / 1000:g}s")


F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class TaskSpec:
    name: str
    func: Callable[..., Any]
    idempotent: bool = False
    is_async: bool = False  # an `async def` handler: run with a fresh event loop
    # `chunk=N`: up to N leased jobs of this task in one child, the handler called with
    # a list of `ChunkJob` (docs/guide/chunks.md); 1: one job per child
    chunk: int = 1

    def call(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run the handler in the job's child: an `async def` one with `asyncio.run`
        (a fresh loop per job, so nothing is shared between jobs but the process's
        imports); a coroutine returned by a plain function is a mistake, said so. A
        chunked task's job run alone (`forq replay`): its handler gets a list of one."""
        if self.chunk > 1:
            return self._alone(args, kwargs)
        return self._invoke(args, kwargs)

    def call_chunk(self, jobs: list[ChunkJob]) -> Any:
        """Run a chunked handler with its chunk's jobs (`task(chunk=N)`)."""
        return self._invoke([jobs], {})

    def _alone(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        ctx = _current
        said: list[tuple[Any, BaseException | None]] = []
        job = ChunkJob(ctx.id if ctx else "", ctx.queue if ctx else "", self.name, args,
                       kwargs, ctx.attempts if ctx else 0, ctx.crashes if ctx else 0,
                       lambda _job, result, exc: said.append((result, exc)),
                       ctx.snoozes if ctx else 0)
        returned = self._invoke([[job]], {})
        if not said:
            if returned is not None and (not isinstance(returned, list) or len(returned) != 1):
                raise TypeError(f"chunked task {self.name!r} returned "
                                f"{type(returned).__name__}; it returns None or a list of 1 "
                                "outcome")
            said.append((None, None) if returned is None else
                        (None, returned[0]) if isinstance(returned[0], BaseException)
                        else (returned[0], None))
        result, exc = said[0]
        if exc is not None:
            raise exc
        return result

    def _invoke(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if self.is_async:
            import asyncio  # preloaded by the fork server when any handler is async

            return asyncio.run(self.func(*args, **kwargs))
        result = self.func(*args, **kwargs)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # never awaited: no "was never awaited" warning
            raise NonRetryable(
                f"task {self.name!r}: handler {getattr(self.func, '__qualname__', self.func)!r} "
                f"returned {type(result).__name__} instead of a result; declare it "
                f"`async def` (forq runs it with asyncio.run) or await inside it")
        return result


_TASKS: dict[str, TaskSpec] = {}


#: the most jobs one chunk may hold (`task(chunk=)`): a claim leases at most 32 jobs
MAX_CHUNK = 32


def task(name: str | None = None, *, idempotent: bool = False,
         chunk: int = 1) -> Callable[[F], F]:
    """Register a handler under `name` (default: ``module.function``); plain functions
    and `async def` ones alike (detected here, each run in its own child).

    ``idempotent=True`` declares every job of this task effectively-once: once its
    handler succeeded it is never run again within the idempotency TTL, even if the
    ack was lost.

    ``chunk=N`` (2 to `MAX_CHUNK`): the supervisor runs up to N leased jobs of this
    task in one child, and the handler is called with a list of `ChunkJob`; each job
    is acked, failed or retried on its own (`ChunkJob.ok` / `ChunkJob.fail` as it goes,
    or the handler's return: None (all succeed), or a list of one outcome per job, an
    exception instance for a failure; a raise fails every job not yet reported). The
    jobs of a chunk share one process: docs/guide/chunks.md says what that gives up.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(f"task {name!r}: chunk must be an integer from 1 to {MAX_CHUNK}, "
                         f"got {chunk!r}")

    def register(func: F) -> F:
        task_name = name or f"{func.__module__}.{func.__name__}"
        _TASKS[task_name] = TaskSpec(task_name, func, idempotent,
                                     inspect.iscoroutinefunction(func), chunk)
        return func

    return register


def preload_runtime() -> None:
    """Called where handler modules were imported, before forking: import what every
    child would otherwise import for itself (asyncio, ≈ 10 ms, for async handlers)."""
    if any(spec.is_async for spec in _TASKS.values()):
        import asyncio  # noqa: F401


def lookup(name: str) -> TaskSpec | None:
    return _TASKS.get(name)


def registered() -> dict[str, TaskSpec]:
    return dict(_TASKS)


@dataclass
class JobContext:
    """What a running handler knows about its job, and its follow-up jobs.

    Follow-ups are not enqueued by the child (a handler never holds the Redis
    connection): they travel to the parent with the result and are enqueued atomically
    with the ack (same queue) or, for another queue, with ids derived from this job's
    id, so a re-run never duplicates them.
    """

    id: str
    queue: str
    task: str
    attempts: int = 0
    crashes: int = 0
    group: str | None = None  # the job's group (enqueued with `group=`), None for none
    # how often its handler put it off so far (`Retry`, `throttle`): at most max_snoozes
    snoozes: int = 0
    followups: list[dict[str, Any]] = field(default_factory=list)
    # W3C traceparent of the handler's span when the supervisor traces ([tracing]):
    # follow-ups carry it, and handler code may parent its own spans to it
    traceparent: str = ""
    # the batch this run opened (`batch`): id, member specs, callbacks; sent with the result
    opened: dict[str, Any] | None = None
    # fd 3 to the supervisor (`forq.channel`); a context made outside a job's child has
    # none: progress goes nowhere and a step runs its function each time
    channel: Channel = field(default_factory=lambda: Channel(-1))

    def progress(self, value: float, message: str = "") -> None:
        """Report how far the job is: `value` from 0 to 1, and a short message (cut at
        500 characters). Throttled (one message every 0.5 s, the last one always sent);
        readable as `Job.progress`, in `forq job ID` and on the dashboard."""
        self.channel.progress(value, message)

    def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this job, over all its runs: its JSON
        result is recorded in the job (fenced by the lease) before this returns, and a
        re-run of the job (after a crash, timeout or reclaim) returns the recorded result
        without calling `fn`. `name` identifies the step within the job (≤ 200 bytes)."""
        return self.channel.step(name, fn, *args, **kwargs)

    async def astep(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`step` for an async handler: `fn` may be a coroutine function."""
        return await self.channel.astep(name, fn, *args, **kwargs)

    def parents(self) -> list[ParentResult]:
        """This job's parents — the jobs of its `depends_on`, or, for a batch's callback,
        the batch's members — each with its state and result (`ParentResult`; state
        "expired" when its record is gone, its result_ttl passed). Read through the
        supervisor (fenced by this run's lease) once per run, page by page."""
        return self.channel.parents(self.id)

    def parent_results(self) -> dict[str, Any]:
        """The results of this job's parents that succeeded, by job id, in order: what
        a dependent or a batch's callback most often wants (`parents` has the rest)."""
        return {p.id: p.result for p in self.parents() if p.state == "succeeded"}

    async def aparents(self) -> list[ParentResult]:
        """`parents` for an async handler (the first call waits for one round trip of
        the supervisor, blocking the loop that long)."""
        return self.parents()

    async def aparent_results(self) -> dict[str, Any]:
        """`parent_results` for an async handler (as `aparents`)."""
        return self.parent_results()

    def throttle(self, duration: Any, *, group: bool = False, reason: str = "") -> None:
        """Pause this job's queue (``group=True``: only this job's group) on every
        supervisor for `duration` (seconds, "60s", a timedelta), e.g. on an HTTP 429,
        and end this run: the job goes back to wait, not counted as an attempt, and runs
        once the pause is over. Never returns (raises `Throttled`). The supervisor caps
        the pause at its queue's ``max_throttle``; a longer pause already in place
        stays. Like a `Retry`, it counts as one of the job's ``max_snoozes``."""
        if group and not self.group:
            raise ValueError(f"job {self.id} has no group: throttle(group=True) needs a job "
                             "enqueued with group=")
        raise Throttled(_delay_ms(duration, "throttle", MAX_THROTTLE_MS), bool(group),
                        str(reason))

    def enqueue(self, task: str, *args: Any, queue: str | None = None, **options: Any) -> str:
        if "depends_on" in options:
            raise PayloadError(f"task {task!r}: depends_on is for producers; a handler's "
                               "follow-ups cannot wait on other jobs (open a batch instead)")
        for name in PRODUCER_ONLY:
            if name in options:
                raise PayloadError(f"task {task!r}: {name} is for producers (Queue.enqueue); "
                                   "a handler's follow-up is enqueued with its ack, as given")
        if args:
            options["args"] = args
        options["job_id"] = f"{self.id}-{len(self.followups) + 1}"
        spec = build_spec(task, options)
        spec["queue"] = queue or self.queue
        spec["parent"] = self.id  # the link `forq job` shows, whichever queue it lands in
        if self.traceparent:
            spec["traceparent"] = self.traceparent
        self.followups.append(spec)
        return str(spec["id"])


    def batch(self, jobs: Any, on_success: Any = None, on_complete: Any = None) -> str:
        """Open a batch from this handler (as `Queue.batch`, on this job's queue); returns
        its id. Sent with the result and opened atomically with this job's ack: this job
        counts as one of its members, so when this job is itself a member of a batch,
        it ends there only once the batch it opened is done. One batch per run."""
        if self.opened is not None:
            raise RuntimeError(f"job {self.id} already opened batch {self.opened['id']}; "
                               "a job opens at most one batch per run")
        spec = build_batch(self.queue, jobs, on_success, on_complete,
                           batch_id=f"{self.id}-b", parent=self.id)
        members = []
        for member_queue, specs in spec.specs.items():
            for member in specs:
                member["queue"] = member_queue
                if self.traceparent:
                    member["traceparent"] = self.traceparent
                members.append(member)
        members.sort(key=lambda m: int(m["id"].rsplit("-", 1)[1]))
        self.opened = {"id": spec.id, "members": members,
                       **{name: spec.record[name] for name in ("on_success", "on_complete")
                          if name in spec.record}}
        return spec.id


class ChunkJob:
    """One job of a chunk, as a chunked handler (`task(chunk=N)`) sees it: its id,
    arguments and counts (`attempts`, `crashes`, and `snoozes`: how often it was put off
    by a `Retry`, as `current().snoozes` counts them), and `ok` / `fail` to report its
    outcome now. A job reported is settled: a crash of the chunk's process later does
    not run it again; the jobs not yet reported when the process dies are retried (each
    as a crash)."""

    def __init__(self, id: str, queue: str, task: str, args: list[Any],  # noqa: A002
                 kwargs: dict[str, Any], attempts: int = 0, crashes: int = 0,
                 report: Callable[[ChunkJob, Any, BaseException | None], None] | None = None,
                 snoozes: int = 0) -> None:
        self.id = id
        self.queue = queue
        self.task = task
        self.args = args
        self.kwargs = kwargs
        self.attempts = attempts
        self.crashes = crashes
        self.snoozes = snoozes
        self.reported = False
        self._report = report

    def __repr__(self) -> str:
        return f"ChunkJob({self.id!r}, {self.task!r})"

    def ok(self, result: Any = None) -> None:
        """This job succeeded with `result` (JSON): reported to the supervisor now."""
        self._settle(result, None)

    def fail(self, exc: BaseException) -> None:
        """This job failed with `exc`: retried per its own retries (`NonRetryable`: dead
        now; `Retry`: again after its delay), reported to the supervisor now."""
        if not isinstance(exc, BaseException):
            raise TypeError(f"job {self.id}: fail() takes an exception, got "
                            f"{type(exc).__name__}")
        self._settle(None, exc)

    def _settle(self, result: Any, exc: BaseException | None) -> None:
        if self.reported:
            raise RuntimeError(f"job {self.id} of this chunk was already reported")
        self.reported = True
        if self._report is not None:  # outside a supervisor's child: nowhere to report
            self._report(self, result, exc)


_current: JobContext | None = None


def current() -> JobContext:
    """The job the calling handler is running. Outside a handler: RuntimeError."""
    if _current is None:
        raise RuntimeError("jobs.current() is only available inside a running handler")
    return _current


def set_current(ctx: JobContext | None) -> None:
    global _current
    _current = ctx
