"""Wait on a condition with a deadline, never a bare sleep (`forq.testing.waiting`)."""

from forq.testing.waiting import wait_for, wait_job

__all__ = ["wait_for", "wait_job"]
