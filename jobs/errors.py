"""Exceptions a producer may see. Each message says what was wrong and where."""

from __future__ import annotations


class ForqError(Exception):
    """Base class for every error forq raises on purpose."""


class PayloadError(ForqError, ValueError):
    """A job's arguments cannot be stored: not JSON-serialisable, or too large."""


class JobNotFound(ForqError, LookupError):
    """No job with this id exists (never enqueued, purged, or its record expired)."""


class JobStateError(ForqError):
    """The job is not in a state the action applies to (promote a running job, change
    the priority of a finished one, …): nothing was changed."""

    def __init__(self, job_id: str, queue: str, state: str, action: str, detail: str) -> None:
        self.job_id = job_id
        self.queue = queue
        self.state = state
        self.action = action
        super().__init__(f"job {job_id} in queue {queue} is {state}: {detail}; nothing changed")


class JobFailed(ForqError):
    """`Job.wait` found the job dead or cancelled instead of succeeded."""

    def __init__(self, job_id: str, state: str, reason: str | None) -> None:
        self.job_id = job_id
        self.state = state
        self.reason = reason
        super().__init__(f"job {job_id} is {state}: {reason or 'no reason recorded'}")


class JobTimeout(ForqError, TimeoutError):
    """`Job.wait` gave up before the job reached a terminal state."""


class NotReplicated(ForqError):
    """A durable write (``min_replicas`` / ``durable=True``) reached the master but
    fewer replicas than required acknowledged it within the timeout (``WAIT``).

    The write did happen on the master: the jobs are enqueued, but a failover right now
    could lose them. Enqueueing again with the same ``job_id`` is safe (a job id that
    exists is answered "duplicate").
    """

    def __init__(self, job_ids: list[str], acknowledged: int, required: int,
                 timeout_ms: int, what: str = "enqueue") -> None:
        self.job_ids = job_ids
        self.acknowledged = acknowledged
        self.required = required
        self.timeout_ms = timeout_ms
        shown = ", ".join(job_ids[:5]) + (f" and {len(job_ids) - 5} more" if len(job_ids) > 5 else "")
        noun = "job" if len(job_ids) == 1 else "jobs"
        super().__init__(
            f"{what} of {noun} {shown or '(none)'} not replicated: {acknowledged} of "
            f"{required} required replica(s) acknowledged within {timeout_ms} ms; the "
            f"master has it, but a failover now could lose it")


class QueueFull(ForqError):
    """Redis is out of memory (``maxmemory`` reached under ``noeviction``) and refused
    to store jobs. Each batch of jobs is one script that Redis refuses before it writes
    anything, so nothing is half-written; enqueueing again later with the same
    ``job_id`` is the remedy (a job that did land is answered "duplicate")."""

    def __init__(self, queue: str, count: int, detail: str, maybe_partial: bool = False) -> None:
        self.queue = queue
        self.count = count
        self.maybe_partial = maybe_partial
        landed = (f"; of a call this large ({count} jobs, sent in batches) the first batches "
                  "may have landed" if maybe_partial else "; nothing was enqueued")
        super().__init__(
            f"queue {queue}: Redis is out of memory ({detail.splitlines()[0][:120]}): "
            f"{count} job(s) refused, none half-written{landed}. Free memory or raise "
            "maxmemory, then enqueue them again (same job_id: no duplicates)")


class IncompatibleFormat(ForqError):
    """Redis holds forq data in a format this version of forq cannot read or write
    safely (a newer forq wrote it). Nothing was changed."""


def refused(exc: Exception) -> Exception:
    """A script's refusal of bad input (an error reply starting "forq: ", such as a
    dependency on an unknown job) as a `PayloadError`; any other error unchanged. In a
    pipeline (a Queue's first enqueue registers the queue in the same round trip)
    redis-py prefixes the reply with "Command # N (...) of pipeline caused error: "."""
    text = str(exc)
    if text.startswith("Command # ") and " of pipeline caused error: " in text:
        text = text.split(" of pipeline caused error: ", 1)[1]
    if text.startswith("forq: "):
        return PayloadError(text[len("forq: "):])
    return exc
