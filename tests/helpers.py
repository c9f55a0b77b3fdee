"""Wait on a condition with a deadline, never a bare sleep (`forq.testing.waiting`), and
tell whether a process has ended."""

import psutil

from forq.testing.waiting import wait_for, wait_job

__all__ = ["gone", "wait_for", "wait_job"]


def gone(pid: int) -> bool:
    """The process no longer runs: reaped, or a zombie nobody has reaped yet. One look,
    not `pid_exists` then `status`: it may end between the two (NoSuchProcess, seen in CI)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
