"""RQ's job functions (and the bodies Celery's and Dramatiq's apps wrap): the same
no-op, stamp and marked sleep as forq's bench/tasks.py."""

from __future__ import annotations

import os
import time


def noop(*_args, **_kwargs):
    return None


def stamp():
    """The wall clock when the job's function started."""
    return time.time()


def marked_sleep(path, seconds=20.0):
    """Append "<pid> <time>" to `path` at start, then sleep: a job to kill."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()} {time.time():.6f}\n")
    time.sleep(seconds)
    return os.getpid()
