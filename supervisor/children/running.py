"""The parent's view of one running child: its lease, its limits, its result pipe,
and how to stop its whole process group.

A child is forked by the fork server or by the supervisor itself (`fork.client`). Its
result pipe is registered in the supervisor's selector, and so is the event of its end:
the fork server's exit report, or the child's pidfd (readable when it exits) if forked
here — no thread and no SIGCHLD race. What its end means is `outcomes.classify`.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import signal
import time
from dataclasses import dataclass, field
from enum import Enum

from forq.queue import Lease
from forq.supervisor.children.chunk_reader import ChunkReader
from forq.supervisor.children.output import OutputReader
from forq.supervisor.children.reader import MessageReader
from forq.supervisor.fork.child import ChildSpec
from forq.supervisor.fork.messages import MAX_STEP_BYTES, RESULT_OVERHEAD, STEP_OVERHEAD, Report
from forq.supervisor.isolation.cgroups import JobCgroups, kill_all
from forq.supervisor.isolation.memory import (
    RootFiles,
    SampleError,
    SharedFiles,
    tree_cpu,
    tree_usage,
)
from forq.supervisor.isolation.shared_memory import SHARED_EVERY, gone, readable_for
from forq.supervisor.isolation.trail import MemoryTrail

log = logging.getLogger("forq.supervisor")

class KillReason(str, Enum):
    """Why the parent stopped a child: it decides the outcome, not the exit status."""

    TIMEOUT = "timeout"  # past its time limit
    MEMORY = "memory"  # past its memory limit (RSS sampling)
    LEASE_LOST = "lease_lost"  # fencing: the lease is no longer provably ours
    CANCELLED = "cancelled"  # `forq cancel`
    RELEASED = "released"  # drain: the lease goes back, nothing counted
    PROTOCOL = "protocol"  # it wrote something that is not a valid message
    PROCESSES = "processes"  # more processes than [sandbox].max_processes (sampled)
    UNMEASURABLE = "unmeasurable"  # its memory cannot be counted (`shared_memory.Unmeasurable`)

    def __str__(self) -> str:
        return self.value


@dataclass
class RunningChild:
    lease: Lease
    spec: ChildSpec
    pid: int
    pidfd: int
    pipe: int
    started: float  # monotonic
    deadline: float  # monotonic: the job's time limit
    reader: MessageReader = field(init=False)
    peak_rss: int = 0
    kill_reason: KillReason | None = None
    kill_detail: str = ""
    sigkill_at: float | None = None  # monotonic: grace after SIGTERM ends
    pipe_open: bool = True
    server: int = 0  # the pid of the fork server that forked it (0: forked here)
    # its pid as that fork server names it (in its exit reports and fencing deadlines):
    # not `pid` when the fork server runs in a PID namespace of its own
    server_pid: int = 0
    oom: str = ""  # its cgroup's OOM kills: "limit" (its memory.max), "outside", "" (none)
    output: int = -1  # the read end of its stdout and stderr (-1: none)
    out: OutputReader = field(init=False)
    proc: RootFiles | None = None  # its /proc files, once sampled (`tree_usage`)
    unreadable_said: bool = False  # logged that some of its open files cannot be read
    samples: int = 0  # memory samples taken that count its shared memory
    shared_bytes: int = 0  # its memory-backed open files, at their last count
    sample_failed: bool = False  # logged that a memory sample of it could not be taken
    # its cost (`cost`): user and system CPU µs of its tree (wait4, or its cgroup's
    # cpu.stat), when the claim that leased it was sent and when it was reaped (monotonic)
    cpu_us: tuple[int, int] = (0, 0)
    claimed: float = 0.0
    ended: float = 0.0
    rss: int = 0  # its last memory sample (bytes), for `forq top`
    cpu_seen: tuple[float, float] | None = None  # (monotonic, CPU s) at the last heartbeat
    trail: MemoryTrail = field(default_factory=MemoryTrail)  # its last seconds' samples
    # a chunk's (`task(chunk=N)`, `children.chunks`): the lease of each of its jobs, this
    # one (`lease`) first; and those whose lease was lost or that were cancelled, which
    # stopped it ([] for a child of one job)
    members: list[Lease] = field(default_factory=list)
    lost: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        cap = max(self.spec.max_result_bytes + RESULT_OVERHEAD, MAX_STEP_BYTES + STEP_OVERHEAD)
        self.out = OutputReader(self.spec.job_id, self.spec.task, self.spec.max_output_bytes)
        if self.spec.chunk:
            self.reader = ChunkReader([m["id"] for m in self.spec.chunk], cap,
                                      self.spec.queue,
                                      {m["id"]: m.get("group") for m in self.spec.chunk})
            return
        self.reader = MessageReader(self.spec.job_id, cap, len(self.spec.steps),
                                    queue=self.spec.queue,
                                    recorded_bytes=sum(map(len, self.spec.steps.values())),
                                    group=self.spec.group)

    def close_output(self) -> None:
        """Read what is left of its output (its processes are gone, or will be)."""
        if self.output < 0:
            return
        self.out.read(self.output)
        self.out.finish()
        os.close(self.output)
        self.output = -1

    def close_after_exit(self, job_cgroups: JobCgroups | None, peak_rss: int) -> None:
        """It was reaped: its last figures (from its cgroup, if it had one, which goes
        now), and its fds closed (its output read to the end first)."""
        if self.spec.cgroup and job_cgroups is not None:
            # the cgroup's peak is what its limit applied to (a child's ru_maxrss also
            # counts the pages it shares with the fork server, charged to the server)
            self.oom = job_cgroups.oom_cause(self.spec.cgroup)
            peak = job_cgroups.usage(self.spec.cgroup, peak=True)
            self.peak_rss = peak if peak else max(self.peak_rss, peak_rss)
            # every process it held, those that left its tree too (wait4 misses them)
            self.cpu_us = job_cgroups.cpu(self.spec.cgroup) or self.cpu_us
            job_cgroups.remove(self.spec.cgroup)
        else:
            self.peak_rss = max(self.peak_rss, peak_rss)
        self.close_output()
        self.close_proc()
        os.close(self.pidfd)
        os.close(self.pipe)
        self.pipe, self.pipe_open = -1, False  # a step answered later is not written

    def tree_usage(self) -> tuple[int, int] | None:
        """(processes, bytes) of its process tree — resident memory, and the
        memory-backed files it holds open when they count (`counts_shared`); None once
        it exited. Raises SampleError: a sample that could not be taken is never 0."""
        shared = None
        if self.counts_shared:
            self.samples += 1
            if (self.samples - 1) % SHARED_EVERY == 0:  # the first, then every SHARED_EVERY
                shared = SharedFiles()
        usage = self._tree_usage(shared)
        if usage is None or not self.counts_shared:
            return usage
        if shared is not None:
            self.shared_bytes = shared.bytes
            if shared.unreadable and not self.unreadable_said:
                self.unreadable_said = True
                log.warning("job %s %s: the open files of its process %s cannot be read "
                            "(permission denied): their shared memory is not counted",
                            self.job_id, self.task, shared.unreadable[0])
            return usage
        return usage[0], usage[1] + self.shared_bytes  # the last count of its files

    def _tree_usage(self, shared: SharedFiles | None) -> tuple[int, int] | None:
        if self.proc is None:
            try:
                self.proc = RootFiles(self.pid)
            except OSError as exc:
                if gone(exc):
                    return None
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise SampleError(f"/proc of process {self.pid}: "
                                      f"{exc.strerror or exc}") from exc
                # out of fds (a low RLIMIT_NOFILE and many children): sampled by path,
                # which holds one at a time, rather than not at all
                if self.forked_by_server and not self.alive():
                    return None
                processes, total = tree_usage(self.pid, shared)
                return (processes, total) if processes else None
            if self.forked_by_server and not self.alive():
                # reaped by its fork server before we opened them: they may be a
                # stranger's that was given its pid
                self.close_proc()
                return None
        return self.proc.usage(shared)

    def cpu_since_seen(self, now: float) -> tuple[float, float] | None:
        """(CPU seconds its tree used so far, its CPU % since the last call or its start)
        — its cgroup's count, or its live processes' and what they reaped; None when
        it cannot be told (it exited, /proc unreadable). For the heartbeat (`forq top`)."""
        if self.spec.cgroup:
            used = JobCgroups.cpu(self.spec.cgroup)
            cpu = None if used is None else (used[0] + used[1]) / 1e6
        elif self.proc is not None:  # its held /proc files answer for it alone
            try:
                cpu = self.proc.cpu()
            except SampleError:
                cpu = None
        elif self.forked_by_server and not self.alive():
            cpu = None  # reaped by its fork server: its pid may be a stranger's
        else:
            try:
                cpu = tree_cpu(self.pid)
            except SampleError:
                cpu = None
        if cpu is None:
            return None
        since, before = self.cpu_seen or (self.started, 0.0)
        self.cpu_seen = (now, cpu)
        return cpu, 100 * max(0.0, cpu - before) / max(now - since, 1e-3)

    @property
    def counts_shared(self) -> bool:
        """Whether its memory-backed open files are sampled: under a memory limit, and
        where the supervisor may read them (`shared_memory.readable_for`)."""
        return self.spec.memory_limit > 0 and readable_for(self.spec.run_as)

    def close_proc(self) -> None:
        if self.proc is not None:
            self.proc.close()
            self.proc = None

    @property
    def forked_by_server(self) -> bool:
        return self.server != 0

    def alive(self) -> bool:
        """Not yet exited (its pidfd is not readable): its pid, and the group id it
        leads, are still its own, even if another process reaps it."""
        return self.pidfd >= 0 and not self.wait_exit(0)

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for it to exit; True if it has."""
        poller = select.poll()  # not select(): a pidfd may be numbered above 1024
        poller.register(self.pidfd, select.POLLIN)
        try:
            return bool(poller.poll(max(0, int(timeout * 1000))))
        except OSError:
            return True

    @property
    def job_id(self) -> str:
        return self.lease.id

    @property
    def queue(self) -> str:
        return self.spec.queue

    @property
    def task(self) -> str:
        return self.spec.task

    def read_pipe(self) -> bool:
        """Read what the child has written; False at EOF, or once nothing more will be
        read from it (a result too large, a protocol violation: see `reader`)."""
        while True:
            try:
                chunk = os.read(self.pipe, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                self.reader.finish()
                return False
            self.reader.feed(chunk)
            if self.reader.done:
                return False

    def signal_group(self, sig: int) -> None:
        if sig == signal.SIGKILL and self.spec.cgroup:
            kill_all(self.spec.cgroup)  # those that left the group too; the cgroup is ours
        if self.forked_by_server and not self.alive():
            return  # the fork server reaps it, and killed its group then: the pid may be reused
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, reason: KillReason, detail: str = "", grace: float = 2.0) -> None:
        """Stop the child's whole process group: SIGTERM now, SIGKILL after `grace`.
        The first reason wins: a timed-out job whose lease is then lost stays a timeout."""
        if self.kill_reason is None:
            self.kill_reason = reason
            self.kill_detail = detail
        if grace <= 0:
            self.signal_group(signal.SIGKILL)
            self.sigkill_at = time.monotonic()
            return
        if self.sigkill_at is None:
            self.signal_group(signal.SIGTERM)
            self.sigkill_at = time.monotonic() + grace

    def report(self) -> Report | None:
        return self.reader.report
