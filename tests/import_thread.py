"""A handler module whose top-level code starts a thread in the fork server, for
tests/test_forkserver.py: a lean fork (`forq.supervisor.fork.leanfork`) would leave the
job believing the thread is there."""

from __future__ import annotations

import threading

from forq import task

threading.Thread(target=threading.Event().wait, daemon=True, name="at-import").start()


@task("tests.threads")
def threads() -> int:
    """How many threads the job's process believes it has."""
    return len(threading.enumerate())
