"""The parent's view of one forked child: fork it, read its report, kill its group,
and say what its end means.

A child is forked by the fork server (`ForkServer`, the supervisor's end of
supervisor/forkserver.py), or here (`spawn`) when there is none. Its result pipe is
registered in the supervisor's selector, and so is the event of its end: the fork
server's exit report, or the child's pidfd (readable when it exits) if forked here —
no thread and no SIGCHLD race.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from forq.queue import Lease
from forq.supervisor.cgroups import JOIN_FAILED, kill_all
from forq.supervisor.child import RESULT_OVERHEAD, ChildSpec, run_child

log = logging.getLogger("forq.supervisor")

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
    server: int = 0  # the pid of the fork server that forked it (0: forked here)
    oom: str = ""  # its cgroup's OOM kills: "limit" (its memory.max), "outside", "" (none)

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
    if child.oom == "limit":
        # the kernel enforced the job's limit in its cgroup: the job's fault, as above
        why = (f"memory limit exceeded (peak {_mib(child.peak_rss)}, limit "
               f"{child.spec.memory_limit / (1 << 20):.0f} MiB; OOM-killed in its cgroup)")
        return Outcome("fail", "memory", reason=why,
                       error={"type": "MemoryLimit", "message": why, "reason": why})
    if child.oom == "outside":  # the machine, or an enclosing cgroup, ran out: not the job
        return Outcome("expire", "crashed",
                       reason=f"OOM-killed outside its own limit: the machine or an enclosing "
                              f"cgroup ran out of memory ({describe_status(status)}, {peak})")
    if (child.spec.cgroup and os.WIFEXITED(status)
            and os.WEXITSTATUS(status) == JOIN_FAILED):
        return Outcome("release", "released", reason="could not join its job cgroup")
    return Outcome("expire", "crashed", reason=f"{describe_status(status)} ({peak})")


class ForkServerError(Exception):
    """The fork server is gone, or did not answer: it must be replaced."""


# a request bigger than this (a spec with a large payload) goes through a memfd
_INLINE_MAX = 60 * 1024
READY_TIMEOUT = 30.0  # start-up: it imports the handler modules
# one fork (about a millisecond when it works): the supervisor's loop waits for it, so a
# fork server that stops answering must not stall lease extension for long
REPLY_TIMEOUT = 3.0


class ForkServer:
    """The supervisor's end of `python -m forq.supervisor.forkserver`: asks it to fork each
    child, and collects the exits it reports (`pending_exits`: pid, status, peak RSS
    in bytes) for the supervisor's loop."""

    def __init__(self, imports: list[str]) -> None:
        self.imports = list(imports)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.set_inheritable(False)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, FORQ_FORKSERVER_PATH=json.dumps(sys.path),
                   PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
        env.pop("FORQ_FORKSERVER_PYTHONPATH", None)
        if "PYTHONPATH" in os.environ:
            env["FORQ_FORKSERVER_PYTHONPATH"] = os.environ["PYTHONPATH"]
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "forq.supervisor.forkserver", str(theirs.fileno()),
                 ",".join(self.imports)],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        except OSError as exc:
            ours.close()
            raise ForkServerError(f"cannot start: {exc}") from exc
        finally:
            theirs.close()
        self.sock = ours
        self.pid = self.proc.pid
        self.pending_exits: list[tuple[int, int, int]] = []
        self.closed = False
        try:
            message, _ = self._receive(READY_TIMEOUT)
            if "ready" not in message:
                raise ForkServerError(f"unexpected first message {message!r}")
        except ForkServerError:
            self.close()
            raise

    def fileno(self) -> int:
        return self.sock.fileno()

    def _receive(self, timeout: float | None) -> tuple[dict[str, Any], list[int]]:
        """One message (waiting up to `timeout`, None: not at all); raises
        ForkServerError on EOF, on a timeout, or on garbage."""
        if timeout is not None:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                raise ForkServerError(f"no answer in {timeout:g}s")
        try:
            data, ancillary, _flags, _ = self.sock.recvmsg(
                65536, socket.CMSG_SPACE(4 * 4), socket.MSG_DONTWAIT)
        except BlockingIOError:
            raise
        except OSError as exc:
            raise ForkServerError(f"socket: {exc}") from exc
        from forq.supervisor.forkserver import fds_of

        fds = fds_of(ancillary)
        if not data:
            for fd in fds:
                os.close(fd)
            try:  # EOF: it is most likely dying; say how it ended, if it ends at once
                code: int | None = self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                code = None
            raise ForkServerError("it closed its socket" if code is None
                                  else f"it ended: {describe_status_code(code)}")
        try:
            message = json.loads(data)
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            raise ForkServerError(f"garbled message: {exc}") from exc
        if "exit" in message:
            self.pending_exits.append((int(message["exit"]), int(message["status"]),
                                       int(message["maxrss"]) * 1024))
        return message, fds

    def drain(self) -> None:
        """Read every message waiting (exits go to `pending_exits`)."""
        while True:
            try:
                _message, fds = self._receive(None)
            except BlockingIOError:
                return
            for fd in fds:
                os.close(fd)

    def spawn(self, lease: Lease, spec: ChildSpec, *, title: str,
              timeout: float) -> RunningChild:
        from forq.supervisor.forkserver import send

        data = json.dumps(dataclasses.asdict(spec), separators=(",", ":"))
        read_fd, write_fd = os.pipe()
        memfd = -1
        try:
            if len(data) + len(title) < _INLINE_MAX:
                message: dict[str, Any] = {"title": title, "spec": json.loads(data)}
                fds = [write_fd]
            else:
                memfd = os.memfd_create("forq-spec", os.MFD_CLOEXEC)
                view = memoryview(data.encode())
                while view:
                    view = view[os.write(memfd, view):]
                message, fds = {"title": title, "memfd": True}, [write_fd, memfd]
            try:
                send(self.sock, message, fds)
            except OSError as exc:
                raise ForkServerError(f"socket: {exc}") from exc
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
            if memfd >= 0:
                os.close(memfd)
        try:
            while True:
                try:
                    reply, fds = self._receive(REPLY_TIMEOUT)
                except BlockingIOError:
                    continue
                if "pid" in reply and fds:
                    pidfd = fds[0]
                    for fd in fds[1:]:
                        os.close(fd)
                    break
                for fd in fds:
                    os.close(fd)
                if "error" in reply:
                    raise OSError(f"fork server: {reply['error']}")
        except BaseException:
            os.close(read_fd)
            raise
        os.set_blocking(read_fd, False)
        now = time.monotonic()
        return RunningChild(lease, spec, int(reply["pid"]), pidfd, read_fd, now, now + timeout,
                            server=self.pid)

    def close(self) -> None:
        """Stop it (its children die with it: PR_SET_PDEATHSIG) and reap it."""
        if self.closed:
            return
        self.closed = True
        self.sock.close()
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.error("fork server %d did not die", self.pid)


def describe_status_code(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
