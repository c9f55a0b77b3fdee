"""forq's producer side: the job model and the queue API. Knows nothing of processes.

    from jobs import Queue, task
"""

from .errors import ForqError, JobFailed, JobNotFound, JobTimeout, NotReplicated, PayloadError
from .job import ACTIVE as ACTIVE
from .job import CANCELLED, DEAD, PENDING, SCHEDULED, STATES, SUCCEEDED, Job
from .queue import Queue, find_job, known_queues
from .registry import NonRetryable, current, task

__all__ = [
    "ACTIVE", "CANCELLED", "DEAD", "PENDING", "SCHEDULED", "STATES", "SUCCEEDED",
    "ForqError", "Job", "JobFailed", "JobNotFound", "JobTimeout", "PayloadError",
    "NonRetryable", "NotReplicated", "Queue", "current", "find_job", "known_queues", "task",
]
