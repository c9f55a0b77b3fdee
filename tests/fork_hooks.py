"""A handler module with an at-fork hook of its own, for tests/test_forkserver.py: a
lean fork (`forq.supervisor.fork.leanfork`) would skip it."""

from __future__ import annotations

import os

from forq import task

_hook_ran_in: int | None = None  # set by the hook, in each child it runs in


def _after_fork_in_child() -> None:
    global _hook_ran_in
    _hook_ran_in = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


@task("tests.fork_hook_ran")
def fork_hook_ran() -> bool:
    return _hook_ran_in == os.getpid()
