"""Memory of a child's whole process tree, sampled cheaply and often.

A job's memory is its child's RSS plus every descendant's (a handler that shells out
to ImageMagick is still one job), plus the memory-backed files they hold open
(`shared_memory`: memfds, /dev/shm), when asked. The direct children of a process are
read from ``/proc/PID/task/TID/children``, which costs a few small reads; where the
kernel lacks it, psutil's scan of /proc is the fallback. A job's child is a child
subreaper (`fork.orphans`), so a double-forked, `setsid` process stays in that tree.

RSS comes from /proc/PID/statm, not /proc/PID/stat: since Linux 6.2 a process's RSS
counters are per CPU, and stat shows only what has been folded into their total, short
by up to a batch of pages per CPU and counter. On this machine's Linux 6.18, a `sleep`
just started read 0 bytes in stat in 204 of 300 tries, in statm in none: statm sums
the per-CPU parts (where a kernel does not, it reads what stat does). The thread count
(whose children files to read) is the link count of /proc/PID/task.

A read that fails raises `SampleError` — the supervisor out of fds, a file it may not
read — and is never taken for "uses nothing": only a process that is gone (ENOENT,
ESRCH) counts as nothing.

`tree_cpu` walks the same tree for the CPU time it used so far (`forq top`'s CPU %).

This is how memory limits are enforced where per-job cgroups (isolation/cgroups.py)
cannot be used: on cgroup v1 and hybrid hosts, and without a delegated cgroup.
"""

from __future__ import annotations

import os

import psutil

from forq.supervisor.isolation.shared_memory import SampleError, SharedFiles, gone

__all__ = ["RootFiles", "SampleError", "SharedFiles", "tree_cpu", "tree_usage"]

PAGE = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of /proc/PID/stat's CPU times
_HAS_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
Usage = tuple[int, int]  # (live processes, bytes)


def _failed(what: str, pid: int, exc: OSError) -> SampleError:
    return SampleError(f"{what} of process {pid}: {exc.strerror or exc}")


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


def _resident(statm: bytes) -> int:
    return int(statm.split()[1]) * PAGE


def _process(pid: int) -> tuple[int, int] | None:
    """(resident bytes, threads) of `pid`; None once it is gone. Raises SampleError."""
    try:
        resident = _resident(_read(f"/proc/{pid}/statm"))
        threads = os.stat(f"/proc/{pid}/task").st_nlink - 2
    except OSError as exc:
        if gone(exc):
            return None
        raise _failed("memory", pid, exc) from exc
    except (IndexError, ValueError) as exc:
        raise SampleError(f"memory of process {pid}: unreadable statm") from exc
    return resident, threads


def rss(pid: int) -> int:
    """Resident bytes of `pid` (0 once it is gone). Raises SampleError."""
    found = _process(pid)
    return found[0] if found else 0


def _children_file(pid: int, tid: int | str) -> list[int]:
    try:
        return [int(p) for p in _read(f"/proc/{pid}/task/{tid}/children").split()]
    except OSError as exc:
        if gone(exc):
            return []  # the thread, or the process, ended: its children are elsewhere now
        raise _failed("children", pid, exc) from exc


def _direct_children(pid: int, threads: int = 0) -> list[int]:
    """Each thread lists the children it forked: one file for a single-threaded
    process, otherwise one per thread found in /proc/PID/task."""
    if threads == 1:
        return _children_file(pid, pid)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError as exc:
        if gone(exc):
            return []
        raise _failed("threads", pid, exc) from exc
    return [child for tid in tids for child in _children_file(pid, tid)]


def tree_usage(pid: int, shared: SharedFiles | None = None) -> Usage:
    """(processes, bytes) of `pid` and its live descendants — resident memory, and the
    memory-backed files they hold open if `shared` tallies them: two small reads a
    process for most, so that sampling 1,000 jobs' trees stays cheap. (0, 0) if `pid`
    is gone. Raises SampleError."""
    count, resident = _walk(pid, shared)
    return count, resident + (shared.bytes if shared is not None and count else 0)


def _walk(pid: int, shared: SharedFiles | None) -> Usage:
    """(processes, resident bytes) of `pid`'s tree; its open files into `shared`."""
    if not _HAS_CHILDREN_FILE:
        pids = _psutil_tree(pid)
        if shared is not None:
            for p in pids:
                shared.add(p)
        return len(pids), sum(rss(p) for p in pids)
    count, total, todo = 0, 0, [pid]
    while todo:
        current = todo.pop()
        found = _process(current)
        if found is None:
            continue  # gone: so are the children it had, re-parented away from the tree
        resident, threads = found
        count, total = count + 1, total + resident
        if shared is not None:
            shared.add(current)
        todo.extend(_direct_children(current, threads))
    return count, total


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) `pid` and its live descendants used so far, with the
    descendants they reaped; 0.0 if `pid` is gone. Raises SampleError."""
    ticks = 0
    todo = [pid] if _HAS_CHILDREN_FILE else _psutil_tree(pid)
    while todo:
        current = todo.pop()
        try:
            fields = _read(f"/proc/{current}/stat").rsplit(b")", 1)[1].split()
            ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
            threads = int(fields[17])
        except OSError as exc:
            if gone(exc):
                continue
            raise _failed("CPU time", current, exc) from exc
        except (ValueError, IndexError) as exc:
            raise SampleError(f"CPU time of process {current}: unreadable stat") from exc
        if _HAS_CHILDREN_FILE:
            todo.extend(_direct_children(current, threads))
    return ticks / CLOCK_TICKS


class RootFiles:
    """A job's root process's /proc files, held open for its repeated samples: each is
    then one pread or fstat, not an open, a read and a close (a supervisor with 1,000
    children spent most of its CPU on those), and a held file answers for the process
    it was opened on only, never for a later one given the same pid (ESRCH once it is
    gone). The caller checks that the process was still its own once these were
    opened."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fds: list[int] = []
        try:
            self.statm = self._open(f"/proc/{pid}/statm")
            self.stat = self._open(f"/proc/{pid}/stat")  # its CPU time (`cpu`)
            self.task = self._open(f"/proc/{pid}/task", os.O_DIRECTORY)
            # without the kernel's children files: psutil, by path
            self.children = (self._open(f"/proc/{pid}/task/{pid}/children")
                             if _HAS_CHILDREN_FILE else -1)
        except OSError:
            self.close()
            raise

    def _open(self, path: str, flags: int = 0) -> int:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
        self.fds.append(fd)
        return fd

    def usage(self, shared: SharedFiles | None = None) -> Usage | None:
        """(processes, bytes) of the root and its live descendants (with `shared`:
        their memory-backed open files too); None once the root is gone. Raises
        SampleError."""
        if self.children < 0:
            found = tree_usage(self.pid, shared)
            return found if found[0] else None
        try:
            count, total = 1, _resident(os.pread(self.statm, 4096, 0))
            kids = self._kids()
        except OSError as exc:
            if gone(exc):
                return None
            raise _failed("memory", self.pid, exc) from exc
        except (IndexError, ValueError) as exc:
            raise SampleError(f"memory of process {self.pid}: unreadable statm") from exc
        if shared is not None:
            shared.add(self.pid)
        for kid in kids:
            processes, resident = _walk(kid, shared)
            count, total = count + processes, total + resident
        return count, total + (shared.bytes if shared is not None else 0)

    def cpu(self) -> float | None:
        """CPU seconds the root and its live descendants used so far, with what they
        reaped (`tree_cpu`, by the held files: the heartbeat asks it of every child);
        None once the root is gone (its end's own figure is the wait4 rusage). Raises
        SampleError."""
        if self.children < 0:
            return tree_cpu(self.pid)
        try:
            fields = os.pread(self.stat, 4096, 0).rsplit(b")", 1)[1].split()
            ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
            kids = self._kids()
        except OSError as exc:
            if gone(exc):
                return None
            raise _failed("CPU time", self.pid, exc) from exc
        except (ValueError, IndexError) as exc:
            raise SampleError(f"CPU time of process {self.pid}: unreadable stat") from exc
        return ticks / CLOCK_TICKS + sum(tree_cpu(kid) for kid in kids)

    def _kids(self) -> list[int]:
        if os.fstat(self.task).st_nlink == 3:  # one thread: one children file
            return [int(p) for p in _pread_all(self.children).split()]
        return _direct_children(self.pid)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _psutil_tree(pid: int) -> list[int]:
    """`pid` and its live descendants, by psutil's scan of /proc (kernels without the
    children files); [] if `pid` is gone. Raises SampleError."""
    try:
        proc = psutil.Process(pid)
        return [pid] + [c.pid for c in proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    except (psutil.Error, OSError) as exc:
        raise SampleError(f"processes of {pid}: {exc}") from exc
