"""Resident memory of a child's whole process tree, sampled cheaply and often.

A job's memory is its child's RSS plus every descendant's (a handler that shells out
to ImageMagick is still one job). The direct children of a process are read from
``/proc/PID/task/TID/children``, which costs a few small reads; where the kernel lacks
it, psutil's scan of /proc is the fallback.

This is how memory limits are enforced where per-job cgroups (supervisor/isolation/cgroups.py)
cannot be used: on cgroup v1 and hybrid hosts, and without a delegated cgroup.
"""

from __future__ import annotations

import os

import psutil

PAGE = os.sysconf("SC_PAGE_SIZE")
_HAS_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _read(path: str) -> bytes:
    """A /proc file's whole content, by bare syscalls: `open()` builds a buffered file
    object per read, which made sampling 1,000 children cost twice as much."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:  # a children list this long is rare: read on
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _pread_all(fd: int) -> bytes:
    """A held /proc file's whole content, read afresh from its start."""
    chunks = [os.pread(fd, 65536, 0)]
    while len(chunks[-1]) == 65536:  # a fork bomb's children list: read on
        chunks.append(os.pread(fd, 65536, 65536 * len(chunks)))
    return b"".join(chunks)


def _stat(pid: int) -> tuple[int, int]:
    """(resident bytes, threads) of `pid` from one read of /proc/PID/stat; (0, 0) once
    it is gone. Its rss is the one statm gives; the thread count says whether its
    children can be read from one file (its only thread's) or need a listing."""
    try:
        fields = _read(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
        return int(fields[21]) * PAGE, int(fields[17])  # rss, num_threads (man 5 proc)
    except (OSError, IndexError, ValueError):
        return 0, 0


def rss(pid: int) -> int:
    return _stat(pid)[0]


def _children_file(pid: int, tid: int | str) -> list[int]:
    try:
        return [int(p) for p in _read(f"/proc/{pid}/task/{tid}/children").split()]
    except (OSError, ValueError):
        return []


def _direct_children(pid: int, threads: int = 0) -> list[int]:
    """Each thread lists the children it forked: one file for a single-threaded
    process, otherwise one per thread found in /proc/PID/task."""
    if threads == 1:
        return _children_file(pid, pid)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [child for tid in tids for child in _children_file(pid, tid)]


def tree_usage(pid: int) -> tuple[int, int]:
    """(processes, resident bytes) of `pid` and its live descendants: two small reads a
    process for most, so that sampling 1,000 jobs' trees stays cheap."""
    if not _HAS_CHILDREN_FILE:
        pids = _psutil_tree(pid)
        return len(pids), sum(rss(p) for p in pids)
    count, total, todo = 0, 0, [pid]
    while todo:
        current = todo.pop()
        resident, threads = _stat(current)
        if not threads:
            continue  # gone: so are the children it had, reparented away from the tree
        count, total = count + 1, total + resident
        todo.extend(_direct_children(current, threads))
    return count, total


class RootFiles:
    """A job's root process's /proc files, held open for its repeated samples: each is
    then one pread, not an open, a read and a close (a supervisor with 1,000 children
    spent most of its CPU on those), and a held file answers for the process it was
    opened on only, never for a later one given the same pid (ESRCH once it is gone).
    The caller checks that the process was still its own once these were opened."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stat = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        self.children = -1  # without the kernel's children files: psutil, by path
        try:
            if _HAS_CHILDREN_FILE:
                self.children = os.open(f"/proc/{pid}/task/{pid}/children",
                                        os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            os.close(self.stat)
            raise

    def usage(self) -> tuple[int, int] | None:
        """(processes, resident bytes) of the root and its live descendants; None once
        the root is gone."""
        try:
            fields = os.pread(self.stat, 4096, 0).rsplit(b")", 1)[1].split()
            count, total = 1, int(fields[21]) * PAGE
            if self.children < 0:
                return tree_usage(self.pid)
            if int(fields[17]) == 1:  # one thread: its children are all in one file
                kids = [int(p) for p in _pread_all(self.children).split()]
            else:
                kids = _direct_children(self.pid)
        except (OSError, IndexError, ValueError):
            return None
        for kid in kids:
            processes, resident = tree_usage(kid)
            count, total = count + processes, total + resident
        return count, total

    def close(self) -> None:
        for fd in (self.stat, self.children):
            if fd >= 0:
                os.close(fd)
        self.stat = self.children = -1


def _psutil_tree(pid: int) -> list[int]:
    """`pid` and its live descendants, by psutil's scan of /proc (kernels without the
    children files)."""
    try:
        proc = psutil.Process(pid)
        return [pid] + [c.pid for c in proc.children(recursive=True)]
    except psutil.Error:
        return [pid]
