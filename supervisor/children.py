"""The parent's view of one forked child: fork it, read its report, kill its group,
and say what its end means.

A child is watched through a pidfd (readable when it exits) and its result pipe,
both registered in the supervisor's selector, so no thread and no SIGCHLD race.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from jobs.queue import Lease

from .child import RESULT_OVERHEAD, ChildSpec, run_child

# why the parent killed a child; decides the outcome instead of the exit status
TIMEOUT = "timeout"
MEMORY = "memory"
LEASE_LOST = "lease_lost"
CANCELLED = "cancelled"
RELEASED = "released"


@dataclass
class RunningChild:
    lease: Lease
    spec: ChildSpec
    pid: int
    pidfd: int
    pipe: int
    started: float  # monotonic
    deadline: float  # monotonic: the job's time limit
    buf: bytearray = field(default_factory=bytearray)
    peak_rss: int = 0
    kill_reason: str | None = None
    kill_detail: str = ""
    sigkill_at: float | None = None  # monotonic: grace after SIGTERM ends
    overflow: bool = False
    pipe_open: bool = True

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
        """Read what the child has written; False at EOF. Caps what is kept, so a
        runaway result becomes a failure instead of filling the parent's memory."""
        cap = self.spec.max_result_bytes + RESULT_OVERHEAD
        while True:
            try:
                chunk = os.read(self.pipe, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            if len(self.buf) + len(chunk) > cap:
                self.overflow = True
            else:
                self.buf += chunk

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, reason: str, detail: str = "", grace: float = 2.0) -> None:
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

    def report(self) -> dict[str, Any] | None:
        if self.overflow or not self.buf:
            return None
        try:
            value = json.loads(self.buf)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


def spawn(lease: Lease, spec: ChildSpec, *, title: str, timeout: float) -> RunningChild:
    """Fork one child for `lease`; the parent returns at once with its handles."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        run_child(spec, write_fd, parent, title)
    os.close(write_fd)
    flags = fcntl.fcntl(read_fd, fcntl.F_GETFL)
    fcntl.fcntl(read_fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    os.set_inheritable(read_fd, False)
    pidfd = os.pidfd_open(pid)
    now = time.monotonic()
    return RunningChild(lease, spec, pid, pidfd, read_fd, now, now + timeout)


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)} without a result"


@dataclass
class Outcome:
    """What the parent will tell Redis about a finished child."""

    kind: str  # ack | fail | expire | release | drop
    metric: str  # the forq_jobs_finished_total outcome label (fail refines it later)
    result_json: str = "null"
    followups: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] = field(default_factory=dict)
    mode: str = "retry"
    reason: str = ""


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def classify(child: RunningChild, status: int) -> Outcome:
    """Exit classification: a report → ack or fail; our own kill → its reason;
    anything else (a signal, an exit without a report, the OOM killer) → a crash."""
    peak = f"peak RSS {_mib(child.peak_rss)}"
    reason = child.kill_reason
    if reason == LEASE_LOST:
        return Outcome("drop", "lease_lost", reason="lease lost; result dropped")
    if reason == RELEASED:
        return Outcome("release", "released", reason=child.kill_detail or "drain")
    if reason == CANCELLED:
        return Outcome("fail", "cancelled", mode="cancel",
                       error={"type": "Cancelled", "message": "cancelled",
                              "reason": "cancelled"})
    if reason == TIMEOUT:
        why = f"timeout after {child.kill_detail}"
        return Outcome("fail", "timeout", reason=why,
                       error={"type": "Timeout", "message": why, "reason": why})
    if reason == MEMORY:
        why = f"memory limit exceeded (peak {_mib(child.peak_rss)}, limit {child.kill_detail})"
        return Outcome("fail", "memory", reason=why,
                       error={"type": "MemoryLimit", "message": why, "reason": why})
    if child.overflow:
        why = f"result too large: over {child.spec.max_result_bytes} bytes (max_result_bytes)"
        return Outcome("fail", "failed", mode="fatal", reason=why,
                       error={"type": "ResultTooLarge", "message": why, "reason": why})
    report = child.report()
    if report is not None and os.WIFEXITED(status):
        if report.get("ok"):
            return Outcome("ack", "succeeded",
                           result_json=json.dumps(report.get("result"), separators=(",", ":")),
                           followups=report.get("followups") or [])
        error = report.get("error") or {}
        if (error.get("type") == "MemoryError" and child.spec.memory_limit
                and child.spec.address_space_factor > 0):
            # the address-space rlimit (the backstop of the memory limit) refused an
            # allocation before the RSS sampling saw it: the same limit, said the same way
            why = (f"memory limit exceeded (peak {_mib(child.peak_rss)}, limit "
                   f"{child.spec.memory_limit / (1 << 20):.0f} MiB; address-space backstop)")
            error = {**error, "reason": why}
        return Outcome("fail", "failed", error=error, reason=error.get("reason", "error"),
                       mode="fatal" if report.get("fatal") else "retry")
    return Outcome("expire", "crashed", reason=f"{describe_status(status)} ({peak})")
