"""Forking job children through the fork server: `ForkServer`, the supervisor's end of
`python -m forq.supervisor.fork.server` (without one, `alone.spawn` starts a fresh
interpreter per job). Either way the supervisor gets a `RunningChild` back at once."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from forq.queue import Lease
from forq.supervisor.children.output import OutputReader
from forq.supervisor.children.running import RunningChild
from forq.supervisor.fork.child import ChildSpec
from forq.supervisor.fork.environment import Launch
from forq.supervisor.fork.fingerprint import code_name, is_fingerprint
from forq.supervisor.fork.messages import channel
from forq.supervisor.fork.orphans import DEATH_SIGNAL
from forq.supervisor.fork.protocol import BadTaskTable, TaskInfo, encode, fds_of, send_encoded
from forq.supervisor.fork.protocol import parse as parse_tasks

log = logging.getLogger("forq.supervisor")


def pid_of(pidfd: int) -> int:
    """The pid a pidfd refers to, in our pid namespace (from the kernel, not from
    whoever sent us the pidfd). Read with os.open: a text-mode open() of the same file
    cost the supervisor 48 µs of CPU a job (its fstat, isatty, lseek and two reads),
    this 19 (bench/RESULTS.md, Findings XIV)."""
    fd = os.open(f"/proc/self/fdinfo/{pidfd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        info = os.read(fd, 4096)
    finally:
        os.close(fd)
    for line in info.splitlines():
        if line.startswith(b"Pid:"):
            return int(line.split()[1])
    raise OSError(f"fd {pidfd} is not a pidfd")


class ForkServerError(Exception):
    """The fork server is gone, or did not answer: it must be replaced."""


class ForkServerFatal(ForkServerError):
    """The fork server could not start for a reason a new one would meet again (a
    handler module that does not import, `run_as` without the privilege): exit 2.
    `module` names the module that failed, if one did."""

    def __init__(self, why: str, module: str = "") -> None:
        super().__init__(why)
        self.module = module


# a request bigger than this (a spec with a large payload) goes through a memfd
_INLINE_MAX = 60 * 1024
READY_TIMEOUT = 30.0  # start-up: it imports the handler modules
READY_MAX = 1 << 21  # its first message carries the task table
OUTPUT_CAP = 1 << 20  # what a fork server prints, logged over its life
# one fork (about a millisecond when it works): the supervisor's loop waits for it, so a
# fork server that stops answering must not stall lease extension for long
REPLY_TIMEOUT = 3.0
_FENCE_BATCH = 1000  # deadlines per message: well under the server's RECV_MAX
# how long a fork server told to go gets to end its jobs' processes before SIGKILL
CLOSE_GRACE = 1.0


class ForkServer:
    """The supervisor's end of `python -m forq.supervisor.fork.server`: asks it to fork each
    child, tells it each child's fencing deadline, and collects the exits it reports
    (`pending_exits`: pid, status, peak RSS in bytes, whether it killed the child for its
    fencing deadline, user and system CPU µs) for the supervisor's loop."""

    def __init__(self, launch: Launch, *,
                 while_waiting: tuple[float, Callable[[], object]] | None = None,
                 wait: bool = True) -> None:
        """Start one and wait for its task table. `while_waiting` (every, call): what the
        supervisor must go on doing meanwhile — its handler modules may take seconds to
        import on a loaded machine, longer than a running job's lease would last.
        `wait=False`: return at once; the caller reads the table with `finish_start`
        when `sock` is readable (a reload: the old fork server serves meanwhile)."""
        self.launch = launch
        self.tasks: dict[str, TaskInfo] = {}
        self.namespaces_problem: str | None = None  # "" they work; None: not tried
        self.hidden: tuple[str, ...] = ()  # of launch.hide, those no job can read
        # the handler code it imported: its fingerprint (`fingerprint`), and that with
        # [supervisor].version, as job records name it (`code_name`)
        self.fingerprint = ""
        self.code = launch.version
        self.huge_pages = ""  # what its memory is on, as it said (for the start-up line)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.set_inheritable(False)
        # the same interpreter finds `forq` as we did; the handler modules resolve on
        # our import path, which it adopts before importing them
        env = launch.server_env()
        # its stdout and stderr (what handler modules print at import) are read like a
        # job's: never the supervisor's own log, which it could truncate
        out_r, out_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "forq.supervisor.fork.server", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=out_w,
                stderr=out_w, env=env)
        except OSError as exc:
            ours.close()
            os.close(out_r)
            raise ForkServerError(f"cannot start: {exc}") from exc
        finally:
            theirs.close()
            os.close(out_w)
        os.set_blocking(out_r, False)
        self.output = out_r
        self.out = OutputReader("", "", OUTPUT_CAP, who=f"fork server {self.proc.pid}")
        self.sock = ours
        self.pid = self.proc.pid
        self.pending_exits: list[tuple[int, int, int, bool, int, int]] = []
        self.closed = False
        if wait:
            try:
                self.finish_start(self._await_ready(while_waiting))
            except ForkServerError:
                self.close()
                raise

    def finish_start(self, timeout: float | None = None) -> bool:
        """Read its first message, waiting up to `timeout` (None: not at all): True once
        it serves, False if the message has not come yet. Raises ForkServerFatal or
        ForkServerError if it did not start (the caller closes it)."""
        try:
            message, fds = self._receive(timeout, READY_MAX)
        except BlockingIOError:
            return False
        for fd in fds:
            os.close(fd)
        if "fatal" in message:
            raise ForkServerFatal(str(message["fatal"])[:4000],
                                  str(message.get("module", ""))[:300])
        if "ready" not in message:
            raise ForkServerError(f"unexpected first message {str(message)[:200]}")
        if "namespaces" in message:
            self.namespaces_problem = str(message["namespaces"])[:500]
        # said by a process that ran handler modules: one printable line, capped
        self.huge_pages = "".join(c if c.isprintable() else "?"
                                  for c in str(message.get("huge_pages", ""))[:300])
        hidden = message.get("hidden")
        if isinstance(hidden, list):
            self.hidden = tuple(p for p in self.launch.hide if p in hidden)
        try:
            self.tasks = parse_tasks(message.get("tasks"))
        except BadTaskTable as exc:
            raise ForkServerError(f"bad task table: {exc}") from None
        if not is_fingerprint(message.get("code")):
            raise ForkServerError(f"bad code fingerprint {str(message.get('code'))[:40]!r}")
        self.fingerprint = message["code"]
        self.code = code_name(self.launch.version, self.fingerprint)
        return True

    def fileno(self) -> int:
        return self.sock.fileno()

    def _await_ready(self, while_waiting: tuple[float, Callable[[], object]] | None) -> float:
        """Wait for its first message, calling `while_waiting` on its period meanwhile;
        returns what is left of READY_TIMEOUT."""
        deadline = time.monotonic() + READY_TIMEOUT
        if while_waiting is not None:
            every, call = while_waiting
            while (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([self.sock], [], [], min(every, left))
                if ready:
                    break
                call()
        return max(0.0, deadline - time.monotonic())

    def _receive(self, timeout: float | None,
                 size: int = 65536) -> tuple[dict[str, Any], list[int]]:
        """One message (waiting up to `timeout`, None: not at all); raises
        ForkServerError on EOF, on a timeout, or on garbage: the fork server runs
        handler modules' top-level code, so what it says is checked like a child's."""
        if timeout is not None:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                raise ForkServerError(f"no answer in {timeout:g}s")
        try:
            data, ancillary, flags, _ = self.sock.recvmsg(
                size, socket.CMSG_SPACE(4 * 4), socket.MSG_DONTWAIT)
        except BlockingIOError:
            raise
        except OSError as exc:
            raise ForkServerError(f"socket: {exc}") from exc
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
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise ValueError("message too long")
            message = json.loads(data)
            if not isinstance(message, dict):
                raise ValueError(f"not an object: {type(message).__name__}")
            if "exit" in message:
                exit_ = (message["exit"], message["status"], message["maxrss"],
                         message.get("utime_us", 0), message.get("stime_us", 0))
                if not all(type(v) is int and 0 <= v < 1 << 40 for v in exit_):
                    raise ValueError(f"bad exit report {str(message)[:200]}")
                self.pending_exits.append((exit_[0], exit_[1], exit_[2] * 1024,
                                           message.get("fenced") is True, exit_[3], exit_[4]))
        except (ValueError, KeyError, RecursionError) as exc:
            for fd in fds:
                os.close(fd)
            raise ForkServerError(f"garbled message: {str(exc)[:200]}") from None
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

    def spawn(self, lease: Lease, spec: ChildSpec, *, title: str, timeout: float,
              fence_at: float | None = None) -> RunningChild:
        """Have it fork a child for `lease`; `fence_at` (monotonic): kill it then unless
        `fence` moves that deadline on."""
        # its fields are JSON values already: vars(), not dataclasses.asdict's deep copy
        # (about 90 µs a job, on the way from the claim to the handler's first line),
        # and the request encoded once, whichever way it goes
        message: dict[str, Any] = {"title": title, "spec": vars(spec)}
        if fence_at is not None:
            message["fence_at"] = fence_at
        data = encode(message)
        read_fd, write_fd = channel()  # the child's fd 3
        out_r, out_w = os.pipe()  # the child's stdout and stderr
        memfd = -1
        try:
            fds = [write_fd, out_w]
            if len(data) >= _INLINE_MAX:  # the spec in a memfd, the rest inline
                memfd = os.memfd_create("forq-spec", os.MFD_CLOEXEC)
                view = memoryview(encode(vars(spec)))
                while view:
                    view = view[os.write(memfd, view):]
                del message["spec"]
                message["memfd"] = True
                data, fds = encode(message), [write_fd, out_w, memfd]
            try:
                send_encoded(self.sock, data, fds)
            except OSError as exc:
                raise ForkServerError(f"socket: {exc}") from exc
        except BaseException:
            os.close(read_fd)
            os.close(out_r)
            raise
        finally:
            os.close(write_fd)
            os.close(out_w)
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
                    name = reply["pid"]  # what it calls the child (in its PID namespace)
                    if type(name) is not int or name <= 0:
                        os.close(pidfd)
                        raise ForkServerError(f"a fork reply with a bad pid: {reply}"[:300])
                    try:  # the kernel's word for which process it is, not the message's
                        pid = pid_of(pidfd)
                    except (OSError, ValueError) as exc:
                        os.close(pidfd)
                        raise ForkServerError(f"no pidfd with its fork reply: {exc}") from None
                    if pid == -1:
                        # already exited and reaped: never signalled (its pidfd says it
                        # exited); the exit report names it by `name`
                        pid = name
                    if pid <= 0:
                        os.close(pidfd)
                        raise ForkServerError(f"a fork reply without a live child: {reply}"[:300])
                    break
                for fd in fds:
                    os.close(fd)
                if "error" in reply:
                    raise OSError(f"fork server: {str(reply['error'])[:500]}")
        except BaseException:
            os.close(read_fd)
            os.close(out_r)
            raise
        os.set_blocking(read_fd, False)
        os.set_blocking(out_r, False)
        now = time.monotonic()
        return RunningChild(lease, spec, pid, pidfd, read_fd, now, now + timeout,
                            server=self.pid, server_pid=name, output=out_r)

    def read_output(self) -> bool:
        """Log what it printed; False at EOF."""
        return self.output >= 0 and self.out.read(self.output)

    def fence(self, deadlines: list[tuple[int, float]]) -> None:
        """New fencing deadlines (pid, monotonic time) for its children. Never blocks:
        if its socket is full the update is dropped, and the next one (a lease_ttl/3
        later, well before the old deadline) carries it."""
        for start in range(0, len(deadlines), _FENCE_BATCH):
            data = json.dumps({"fence": deadlines[start:start + _FENCE_BATCH]},
                              separators=(",", ":")).encode()
            try:
                self.sock.send(data, socket.MSG_DONTWAIT)
            except OSError:
                return  # full, or gone: a dead fork server is noticed by its EOF

    def retire(self) -> None:
        """Tell it no more children will be asked of it: it lets its spares go at once
        (the running children end in their own time). Never blocks: if its socket is
        full the spares stay until it is closed, and die with it."""
        try:
            self.sock.send(b'{"retire":true}', socket.MSG_DONTWAIT)
        except OSError:
            pass

    def close(self) -> None:
        """Stop it and reap it: its death signal first, on which it ends every process of
        its jobs (escapees included: `orphans`), SIGKILL if it has not gone in
        `CLOSE_GRACE` (its children still die with it: PR_SET_PDEATHSIG)."""
        if self.closed:
            return
        self.closed = True
        self.sock.close()
        for sig, wait in ((DEATH_SIGNAL, CLOSE_GRACE), (signal.SIGKILL, 5.0)):
            try:
                self.proc.send_signal(sig)
            except OSError:
                pass
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                if sig == signal.SIGKILL:
                    log.error("fork server %d did not die", self.pid)
        if self.output >= 0:
            self.out.read(self.output)
            self.out.finish()
            os.close(self.output)
            self.output = -1


def describe_status_code(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"
