"""Resident memory of a child's whole process tree, sampled cheaply and often.

A job's memory is its child's RSS plus every descendant's (a handler that shells out
to ImageMagick is still one job). The direct children of a process are read from
``/proc/PID/task/TID/children``, which costs a few small reads; where the kernel lacks
it, psutil's scan of /proc is the fallback.

This is how memory limits are enforced where per-job cgroups (supervisor/cgroups.py)
cannot be used: on cgroup v1 and hybrid hosts, and without a delegated cgroup.
"""

from __future__ import annotations

import os

import psutil

PAGE = os.sysconf("SC_PAGE_SIZE")
_HAS_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _direct_children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(p) for p in f.read().split())
        except OSError:
            continue
    return found


def tree_pids(pid: int) -> list[int]:
    """`pid` and all of its live descendants."""
    if not _HAS_CHILDREN_FILE:
        try:
            proc = psutil.Process(pid)
            return [pid] + [c.pid for c in proc.children(recursive=True)]
        except psutil.Error:
            return [pid]
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        todo.extend(_direct_children(current))
    return pids


def tree_rss(pid: int) -> int:
    """Bytes resident in `pid` and its descendants (0 once they are gone)."""
    return sum(rss(p) for p in tree_pids(pid))
