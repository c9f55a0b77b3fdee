"""Exceptions a producer may see. Each message says what was wrong and where."""

from __future__ import annotations


class ForqError(Exception):
    """Base class for every error forq raises on purpose."""


class PayloadError(ForqError, ValueError):
    """A job's arguments cannot be stored: not JSON-serialisable, or too large."""


class JobNotFound(ForqError, LookupError):
    """No job with this id exists (never enqueued, purged, or its record expired)."""


class JobFailed(ForqError):
    """`Job.wait` found the job dead or cancelled instead of succeeded."""

    def __init__(self, job_id: str, state: str, reason: str | None) -> None:
        self.job_id = job_id
        self.state = state
        self.reason = reason
        super().__init__(f"job {job_id} is {state}: {reason or 'no reason recorded'}")


class JobTimeout(ForqError, TimeoutError):
    """`Job.wait` gave up before the job reached a terminal state."""
