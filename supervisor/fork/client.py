"""Forking job children: through the fork server (`ForkServer`, the supervisor's end of
`python -m forq.supervisor.fork.server`), or from the supervisor itself (`spawn`) when
there is none. Either way the supervisor gets a `RunningChild` back at once."""

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
from typing import Any

from forq.queue import Lease
from forq.supervisor.fork.child import ChildSpec, run_child
from forq.supervisor.fork.protocol import fds_of, send
from forq.supervisor.running import RunningChild

log = logging.getLogger("forq.supervisor")


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



class ForkServerError(Exception):
    """The fork server is gone, or did not answer: it must be replaced."""


# a request bigger than this (a spec with a large payload) goes through a memfd
_INLINE_MAX = 60 * 1024
READY_TIMEOUT = 30.0  # start-up: it imports the handler modules
# one fork (about a millisecond when it works): the supervisor's loop waits for it, so a
# fork server that stops answering must not stall lease extension for long
REPLY_TIMEOUT = 3.0
_FENCE_BATCH = 1000  # deadlines per message: well under the server's RECV_MAX


class ForkServer:
    """The supervisor's end of `python -m forq.supervisor.fork.server`: asks it to fork each
    child, tells it each child's fencing deadline, and collects the exits it reports
    (`pending_exits`: pid, status, peak RSS in bytes, whether it killed the child for its
    fencing deadline) for the supervisor's loop."""

    def __init__(self, imports: list[str]) -> None:
        self.imports = list(imports)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.set_inheritable(False)
        # the same interpreter finds `forq` as we did; the handler modules resolve on
        # our import path, which it adopts before importing them
        env = dict(os.environ, FORQ_FORKSERVER_PATH=json.dumps(sys.path))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "forq.supervisor.fork.server", str(theirs.fileno()),
                 ",".join(self.imports)],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        except OSError as exc:
            ours.close()
            raise ForkServerError(f"cannot start: {exc}") from exc
        finally:
            theirs.close()
        self.sock = ours
        self.pid = self.proc.pid
        self.pending_exits: list[tuple[int, int, int, bool]] = []
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
                                       int(message["maxrss"]) * 1024,
                                       message.get("fenced") is True))
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
            if fence_at is not None:
                message["fence_at"] = fence_at
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
