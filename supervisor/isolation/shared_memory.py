"""Shared memory a job holds in files — memfds, /dev/shm, any tmpfs — counted in its
memory where per-job cgroups do not count it.

RSS counts the pages a process has mapped. A file in a memory-backed filesystem holds
its pages whether or not anyone maps them: 300 MiB written to a memfd, or to a file in
/dev/shm, and never mapped, is in no process's RSS. So the memory sampler
(`isolation.memory`) also looks through the open files of each process of a job's
tree (/proc/PID/fd) and adds the allocated size of each memory-backed file once,
however many of the job's processes hold it, on every `SHARED_EVERY`th sample. Only files on a memory-backed
filesystem are stat'ed, chosen by the path the kernel gives (a memfd's "/memfd:…", or
a path under a tmpfs, ramfs or hugetlbfs mount): a file on a hung network mount is
never touched. The pages of such a file that a process also maps count twice, as
pages forked processes share are counted in each one's RSS.

Reading another user's /proc/PID/fd needs CAP_SYS_PTRACE (or that user, and a dumpable
process): a root supervisor has it, unless a container dropped it, as Docker does by
default. `readable_for` says, for a `run_as` user, whether the supervisor can; where it
cannot, this count is off and the start-up line says so.

Not counted here (per-job cgroups count them): a file whose every fd the job closed
while a mapping of it lives on, a file left in /dev/shm or a System V segment after
every process of it ended, pipe and socket buffers.
"""

from __future__ import annotations

import errno
import os
import pwd
from functools import cache

# open files looked through in one job's processes, at most: a job with more cannot
# have its shared memory counted at a bounded cost (`Unmeasurable`)
FD_SCAN_MAX = 4096
# a job's open files are looked through on every this many memory samples of it (the
# last count stands in between): each look costs about as much as the rest of a sample
SHARED_EVERY = 4
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "hugetlbfs"})
CAP_SYS_PTRACE = 19


class SampleError(Exception):
    """A sample that could not be taken (the supervisor out of fds or memory, a /proc
    file it may not read): never to be read as "uses nothing"."""


class Unmeasurable(SampleError):
    """The job made its memory impossible to count (more than `FD_SCAN_MAX` open
    files): it is stopped as if over its limit."""


def gone(exc: OSError) -> bool:
    """Whether a failed /proc read means the process ended (the only failure that
    means it uses nothing)."""
    return exc.errno in (errno.ENOENT, errno.ESRCH)


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash come as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


@cache
def memory_mounts() -> tuple[str, ...]:
    """Mount points of memory-backed filesystems in our mount namespace, longest first."""
    points = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if " - " in line and line.split(" - ", 1)[1].split()[0] in MEMORY_FILESYSTEMS:
                    points.append(_unescape(fields[4]))
    except OSError:
        pass
    return tuple(sorted(set(points), key=len, reverse=True))


def _memory_backed(target: str) -> bool:
    if target.startswith("/memfd:"):
        return True
    return any(target == point or target.startswith(point.rstrip("/") + "/")
               for point in memory_mounts())


class SharedFiles:
    """One sample's tally of a job's memory-backed files: each counted once."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int]] = set()
        self.bytes = 0
        self.examined = 0  # open files looked at, across the job's processes
        self.unreadable: list[int] = []  # pids whose open files we may not list

    def add(self, pid: int) -> None:
        """Count the memory-backed files `pid` holds open that this sample has not
        seen. Raises SampleError (the supervisor could not look), Unmeasurable (the
        job's processes hold more than `FD_SCAN_MAX` open files: listed lazily, so a
        process with a million costs no more than that)."""
        fd_dir = f"/proc/{pid}/fd/"
        try:
            with os.scandir(fd_dir) as entries:
                for entry in entries:
                    self.examined += 1
                    if self.examined > FD_SCAN_MAX:
                        raise Unmeasurable(f"its processes hold over {FD_SCAN_MAX} open "
                                           f"files: its shared memory cannot be counted")
                    self._count(entry.path)
        except OSError as exc:
            if gone(exc):
                return
            if exc.errno in (errno.EACCES, errno.EPERM):
                self.unreadable.append(pid)
                return
            raise SampleError(f"open files of process {pid}: {exc.strerror or exc}") from exc

    def _count(self, path: str) -> None:
        try:
            if not _memory_backed(os.readlink(path)):
                return
            st = os.stat(path)  # the open file itself, whatever its name now
        except OSError as exc:
            if gone(exc) or exc.errno in (errno.EACCES, errno.EPERM):
                return  # closed meanwhile, or ended
            raise
        key = (st.st_dev, st.st_ino)
        if key not in self.seen:
            self.seen.add(key)
            self.bytes += st.st_blocks * 512


def _has_capability(bit: int) -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError):
        pass
    return False


@cache
def readable_for(run_as: str | None) -> bool:
    """Whether this process can list the open files of jobs run as `run_as` (None: as
    itself, whose processes stay dumpable)."""
    if run_as is None:
        return True
    try:
        uid = pwd.getpwnam(run_as).pw_uid
    except KeyError:
        return False
    # a fork server that changed its uid is not dumpable, nor are the jobs it forks:
    # only CAP_SYS_PTRACE reads them (one that did not change it: `sandbox.drop_to`)
    return (os.getuid(), os.geteuid()) == (uid, uid) or _has_capability(CAP_SYS_PTRACE)
