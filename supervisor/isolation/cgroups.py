"""Per-job cgroups (cgroup v2): the kernel enforces each job's memory limit, and says
when it was the OOM killer that ended a job.

Used where the supervisor may create cgroups: the unified (v2) hierarchy with the memory
controller, and a cgroup of its own that it may write — what systemd hands a unit with
``Delegate=yes``. Elsewhere (cgroup v1 or hybrid hosts, a container without delegation,
a cgroup shared with other processes) forq samples each job's RSS instead
(supervisor/isolation/memory.py); the supervisor says at start-up which mode runs, and why.

Layout under the supervisor's own cgroup BASE::

    BASE/supervisor     the supervisor and its fork server: v2 lets no process live in a
                        cgroup that hands controllers down ("no internal processes")
    BASE/job-<id>.<n>   one per running child: memory.max = the job's limit,
                        memory.swap.max = 0 (else the limit only moves pages to swap),
                        memory.oom.group = 1 (an OOM kill takes the whole job)

The child joins its cgroup itself, right after fork (it writes 0 into cgroup.procs),
so not one line of handler code runs outside it; a child that cannot
join exits with `JOIN_FAILED` before running anything. The supervisor reads
memory.events (``oom``, ``oom_kill``) when a child ends without a report, and memory.peak for the
figure it reports; cgroup.kill stops every process of the job, including those that
left its process group.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from dataclasses import dataclass, field

log = logging.getLogger("forq.supervisor")

JOIN_FAILED = 72  # the child's exit code when it could not enter its cgroup
LEAF = "supervisor"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class CgroupsUnavailable(Exception):
    """Per-job cgroups cannot be used here; ``str()`` says why, for the start-up log."""


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    """Write a cgroup file: never create one (O_CREAT), only the kernel's exist."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _own_cgroup() -> str:
    """This process's cgroup v2 path, or CgroupsUnavailable on a v1/hybrid host."""
    try:
        lines = _read("/proc/self/cgroup").splitlines()
    except OSError as exc:
        raise CgroupsUnavailable(f"cannot read /proc/self/cgroup: {exc.strerror}") from exc
    if len(lines) != 1 or not lines[0].startswith("0::"):
        raise CgroupsUnavailable("cgroup v1/hybrid host")
    return lines[0][3:]


def _cgroup2_mount() -> tuple[str, str]:
    """(mount point, root inside the hierarchy) of the cgroup2 file system."""
    try:
        lines = _read("/proc/self/mountinfo").splitlines()
    except OSError as exc:
        raise CgroupsUnavailable(f"cannot read /proc/self/mountinfo: {exc.strerror}") from exc
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            fields = left.split()
            return fields[4], fields[3]
    raise CgroupsUnavailable("no cgroup2 file system is mounted")


def locate() -> str:
    """The directory of this process's own cgroup, if it is a v2 one."""
    path = _own_cgroup()
    mount, root = _cgroup2_mount()
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return os.path.normpath(mount + "/" + path.lstrip("/"))


def kill_all(path: str) -> None:
    """SIGKILL every process in the cgroup `path`: cgroup.kill where the kernel has it
    (5.14+), else each pid listed, which a fork in between may escape."""
    try:
        _write(f"{path}/cgroup.kill", "1")
        return
    except FileNotFoundError:
        pass
    except OSError:
        return
    try:
        pids = _read(f"{path}/cgroup.procs").split()
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass


@dataclass
class JobCgroups:
    """The supervisor's delegated cgroup BASE, and the job cgroups it creates in it."""

    base: str
    _made: int = 0
    _leftovers: list[str] = field(default_factory=list)

    @classmethod
    def take(cls, base: str | None = None) -> JobCgroups:
        """Move this process into BASE/supervisor and hand the memory controller down to
        BASE's children. BASE must be writable and hold no process but this one."""
        if base is None:
            base = locate()
            if os.path.basename(base) == LEAF:  # started in the leaf of an earlier run
                base = os.path.dirname(base)
        if not os.path.exists(f"{base}/cgroup.type"):  # only the root cgroup has none
            raise CgroupsUnavailable(f"the supervisor runs in the root cgroup ({base}); "
                                     "give it one of its own (systemd: Delegate=yes)")
        try:
            controllers = _read(f"{base}/cgroup.controllers").split()
        except OSError as exc:
            raise CgroupsUnavailable(f"cannot read {base}/cgroup.controllers: "
                                     f"{exc.strerror}") from exc
        if "memory" not in controllers:
            raise CgroupsUnavailable(f"the memory controller is not available in {base}")
        if not all(os.access(f"{base}/{name}", os.W_OK)
                   for name in ("", "cgroup.procs", "cgroup.subtree_control")):
            raise CgroupsUnavailable(f"{base} is not writable by this user "
                                     "(systemd: Delegate=yes)")
        leaf = f"{base}/{LEAF}"
        others = [pid for where in (base, leaf) if os.path.isdir(where)
                  for pid in _read(f"{where}/cgroup.procs").split() if int(pid) != os.getpid()]
        if others:
            raise CgroupsUnavailable(f"{base} is shared with {len(others)} other process(es)")
        try:
            os.makedirs(leaf, exist_ok=True)
            _write(f"{leaf}/cgroup.procs", "0")
            if "memory" not in _read(f"{base}/cgroup.subtree_control").split():
                _write(f"{base}/cgroup.subtree_control", "+memory")
        except OSError as exc:
            raise CgroupsUnavailable(f"cannot set up {base}: {exc.strerror or exc}") from exc
        if "pids" in controllers:  # [sandbox].max_processes as pids.max, where it can be
            try:
                if "pids" not in _read(f"{base}/cgroup.subtree_control").split():
                    _write(f"{base}/cgroup.subtree_control", "+pids")
            except OSError:
                pass
        cgroups = cls(base)
        cgroups._leftovers = [f"{base}/{name}" for name in os.listdir(base)
                              if name.startswith("job-")]  # a previous supervisor's
        cgroups.sweep()
        return cgroups

    def create(self, job_id: str, memory_limit: int, max_processes: int = 0) -> str:
        """A new cgroup for one child of `job_id`, limited to `memory_limit` bytes
        (0: no limit, accounting only) and `max_processes` (0: none; where the pids
        controller is delegated). Returns its directory."""
        self._made += 1
        path = f"{self.base}/job-{_UNSAFE.sub('_', job_id)[:80]}.{self._made}"
        os.mkdir(path)
        try:
            _write(f"{path}/memory.max", str(memory_limit) if memory_limit > 0 else "max")
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1"),
                                ("pids.max", str(max_processes or "max"))):
                try:
                    _write(f"{path}/{name}", value)
                except FileNotFoundError:  # no swap accounting; an old kernel
                    pass
        except OSError:
            self.remove(path)
            raise
        return path

    @staticmethod
    def oom_cause(path: str) -> str:
        """Why the OOM killer killed processes in the cgroup: "limit" (its own
        memory.max was reached), "outside" (the machine, or an enclosing cgroup such as
        the unit's MemoryMax=, ran out: the kernel counts that ``oom`` event there, not
        here), or "" (it did not)."""
        events: dict[str, int] = {}
        try:
            for line in _read(f"{path}/memory.events").splitlines():
                key, _, value = line.partition(" ")
                events[key] = int(value)
        except (OSError, ValueError):
            return ""
        if not events.get("oom_kill"):
            return ""
        return "limit" if events.get("oom") else "outside"

    @staticmethod
    def usage(path: str, peak: bool = False) -> int | None:
        """Bytes charged to the cgroup now (memory.current), or at most so far
        (memory.peak, Linux 5.19+); None where it cannot be read (never a 0)."""
        try:
            return int(_read(f"{path}/{'memory.peak' if peak else 'memory.current'}"))
        except (OSError, ValueError):
            return None

    @staticmethod
    def cpu(path: str) -> tuple[int, int] | None:
        """(user, system) CPU µs of every process the cgroup held (cpu.stat), or None."""
        try:
            stat = dict(line.split(" ", 1) for line in _read(f"{path}/cpu.stat").splitlines())
            return int(stat["user_usec"]), int(stat["system_usec"])
        except (OSError, ValueError, KeyError):
            return None

    def remove(self, path: str) -> None:
        """Remove a job's cgroup once its child has ended. Stragglers (a grandchild that
        left the child's process group) are killed first; a cgroup that is still busy
        is tried again at the next `sweep`."""
        if not _kill_and_remove(path):
            self._leftovers.append(path)

    @property
    def leftovers(self) -> int:
        """Cgroups still busy after their job ended, for `sweep` to try again."""
        return len(self._leftovers)

    def sweep(self) -> None:
        """Try again to remove the cgroups that were still busy."""
        if self._leftovers:
            self._leftovers = [p for p in self._leftovers if not _kill_and_remove(p)]


def _kill_and_remove(path: str) -> bool:
    """True once the cgroup `path` is gone."""
    kill_all(path)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.debug("cgroup %s not removed yet: %s", path, exc.strerror)
        return False
    return True


def probe(mode: str) -> tuple[JobCgroups | None, str]:
    """Per-job cgroups as `mode` ([supervisor].job_cgroups: auto, required, off) asks,
    and the memory-limit mode for the start-up log. "required" raises
    CgroupsUnavailable where "auto" falls back to RSS sampling."""
    if mode == "off":
        return None, "RSS sampling (job_cgroups = off)"
    try:
        cgroups = JobCgroups.take()
    except CgroupsUnavailable as exc:
        if mode == "required":
            raise
        return None, f"RSS sampling ({exc})"
    return cgroups, f"per-job cgroups under {cgroups.base} (cgroup v2 memory.max)"
