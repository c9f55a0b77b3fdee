"""Task registration and the handler's view of its own job.

Handlers register with ``@task("images.resize")`` in modules the supervisor
preloads before forking, so the child finds them without importing anything.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from forq.channel import Channel
from forq.errors import PayloadError
from forq.payload import build_spec
from forq.store.batchspec import build_batch


class NonRetryable(Exception):
    """Raise from a handler to send the job to dead at once: retrying cannot help."""


F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class TaskSpec:
    name: str
    func: Callable[..., Any]
    idempotent: bool = False
    is_async: bool = False  # an `async def` handler: run with a fresh event loop

    def call(self, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run the handler in the job's child: an `async def` one with `asyncio.run`
        (a fresh loop per job, so nothing is shared between jobs but the process's
        imports); a coroutine returned by a plain function is a mistake, said so."""
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


def task(name: str | None = None, *, idempotent: bool = False) -> Callable[[F], F]:
    """Register a handler under `name` (default: ``module.function``); plain functions
    and `async def` ones alike (detected here, each run in its own child).

    ``idempotent=True`` declares every job of this task effectively-once: once its
    handler succeeded it is never run again within the idempotency TTL, even if the
    ack was lost.
    """

    def register(func: F) -> F:
        task_name = name or f"{func.__module__}.{func.__name__}"
        _TASKS[task_name] = TaskSpec(task_name, func, idempotent,
                                     inspect.iscoroutinefunction(func))
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

    def enqueue(self, task: str, *args: Any, queue: str | None = None, **options: Any) -> str:
        if "depends_on" in options:
            raise PayloadError(f"task {task!r}: depends_on is for producers; a handler's "
                               "follow-ups cannot wait on other jobs (open a batch instead)")
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


_current: JobContext | None = None


def current() -> JobContext:
    """The job the calling handler is running. Outside a handler: RuntimeError."""
    if _current is None:
        raise RuntimeError("jobs.current() is only available inside a running handler")
    return _current


def set_current(ctx: JobContext | None) -> None:
    global _current
    _current = ctx
