"""forq's producer side: the job model and the queue API. Knows nothing of processes.

    from forq import Queue, task

`task`, `current`, `NonRetryable` and `Retry` come from `forq.registry`, which imports no redis;
everything else is imported on first use (PEP 562), so a handler module's
`from forq import task` keeps redis out of the fork server and of its job children.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from forq.registry import ChunkJob, NonRetryable, Retry, current, task

if TYPE_CHECKING:
    from forq.async_queue import AsyncJob, AsyncQueue
    from forq.errors import (
        ForqError,
        IncompatibleFormat,
        JobFailed,
        JobNotFound,
        JobStateError,
        JobTimeout,
        NotReplicated,
        PayloadError,
        QueueFull,
    )
    from forq.job import ACTIVE, CANCELLED, DEAD, PENDING, SCHEDULED, STATES, SUCCEEDED, Job
    from forq.queue import Queue, find_job, known_queues
    from forq.store.events import QueueEvent

_LAZY = {
    "ForqError": "errors", "IncompatibleFormat": "errors", "JobFailed": "errors",
    "JobNotFound": "errors", "JobStateError": "errors", "JobTimeout": "errors",
    "NotReplicated": "errors", "PayloadError": "errors", "QueueFull": "errors",
    "ACTIVE": "job", "CANCELLED": "job", "DEAD": "job", "PENDING": "job",
    "SCHEDULED": "job", "STATES": "job", "SUCCEEDED": "job", "Job": "job",
    "Queue": "queue", "find_job": "queue", "known_queues": "queue",
    "AsyncQueue": "async_queue", "AsyncJob": "async_queue", "QueueEvent": "store.events",
}

__all__ = [
    "ACTIVE", "AsyncJob", "AsyncQueue", "CANCELLED", "ChunkJob", "DEAD", "PENDING", "SCHEDULED", "STATES",
    "SUCCEEDED", "ForqError", "IncompatibleFormat", "Job", "JobFailed", "JobNotFound",
    "JobStateError", "JobTimeout", "PayloadError", "NonRetryable", "NotReplicated", "Queue",
    "QueueEvent", "QueueFull", "Retry", "current", "find_job", "known_queues", "task",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
