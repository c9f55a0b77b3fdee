"""Task registration and the handler's view of its own job.

Handlers register with ``@task("images.resize")`` in modules the supervisor
preloads before forking, so the child finds them without importing anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forq.payload import build_spec


class NonRetryable(Exception):
    """Raise from a handler to send the job to dead at once: retrying cannot help."""


@dataclass(frozen=True)
class TaskSpec:
    name: str
    func: Callable[..., Any]
    idempotent: bool = False


_TASKS: dict[str, TaskSpec] = {}


def task(name: str | None = None, *, idempotent: bool = False) -> Callable:
    """Register a handler under `name` (default: ``module.function``).

    ``idempotent=True`` declares every job of this task effectively-once: once its
    handler succeeded it is never run again within the idempotency TTL, even if the
    ack was lost.
    """

    def register(func: Callable[..., Any]) -> Callable[..., Any]:
        task_name = name or f"{func.__module__}.{func.__name__}"
        _TASKS[task_name] = TaskSpec(task_name, func, idempotent)
        return func

    return register


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

    def enqueue(self, task: str, *args: Any, queue: str | None = None, **options: Any) -> str:
        if args:
            options["args"] = args
        options["job_id"] = f"{self.id}-{len(self.followups) + 1}"
        spec = build_spec(task, options)
        spec["queue"] = queue or self.queue
        spec["parent"] = self.id  # the link `forq job` shows, whichever queue it lands in
        self.followups.append(spec)
        return spec["id"]


_current: JobContext | None = None


def current() -> JobContext:
    """The job the calling handler is running. Outside a handler: RuntimeError."""
    if _current is None:
        raise RuntimeError("jobs.current() is only available inside a running handler")
    return _current


def set_current(ctx: JobContext | None) -> None:
    global _current
    _current = ctx
