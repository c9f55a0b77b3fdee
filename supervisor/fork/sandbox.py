"""Privileges and namespaces of the fork server and of each job's child.

`drop_to` is called by the fork server before it imports any handler module, so that
module top-level code never runs with the supervisor's user. A process that changed
its uid is not dumpable: jobs running as the same user can neither ptrace the fork
server nor read its memory through /proc.
"""

from __future__ import annotations

import os
import pwd


def prepare() -> None:
    """Import now what a child needs later: after `drop_to` the interpreter's own
    files may be unreadable (a Python under /root, mode 0700)."""
    import traceback  # noqa: F401

    try:
        import setproctitle  # noqa: F401
    except ImportError:
        pass


def drop_to(user_name: str) -> None:
    """Become `user_name` for good (real, effective and saved ids; no supplementary
    groups). Raises OSError without the privilege, KeyError for an unknown user."""
    user = pwd.getpwnam(user_name)
    if (os.getuid(), os.geteuid()) == (user.pw_uid, user.pw_uid):
        return
    os.setgroups([])
    os.setresgid(user.pw_gid, user.pw_gid, user.pw_gid)
    os.setresuid(user.pw_uid, user.pw_uid, user.pw_uid)
    os.environ["HOME"] = user.pw_dir
    os.environ["USER"] = os.environ["LOGNAME"] = user.pw_name
