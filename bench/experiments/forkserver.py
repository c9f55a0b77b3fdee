"""A lean fork server (prototype): a fresh interpreter holding only `forq.registry`,
`forq.supervisor.child` and the handler modules — no redis — that forks job children on the
supervisor's request.

    python -m bench.experiments.forkserver FD IMPORTS

FD is its end of a SOCK_SEQPACKET socketpair. Requests: a pickled (ChildSpec, title)
with the result pipe's write end attached (SCM_RIGHTS); answers: ("pid", pid) with the
child's pidfd attached, and later ("exit", pid, status, ru_maxrss) when it reaps it.
`jobs/__init__.py` (which imports redis through forq.queue) is bypassed with a bare
package module; the real fix is to make that import lazy.
"""

from __future__ import annotations

import array
import ctypes
import gc
import importlib
import os
import pickle
import select
import signal
import socket
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def _lean_jobs() -> None:
    pkg = types.ModuleType("jobs")
    pkg.__path__ = [str(REPO / "jobs")]
    sys.modules["jobs"] = pkg
    from forq import registry

    pkg.task = registry.task
    pkg.current = registry.current
    pkg.NonRetryable = registry.NonRetryable
    pkg.registry = registry


def _fds(ancillary: list) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


def serve(sock: socket.socket, imports: list[str]) -> None:
    _lean_jobs()
    for name in imports:
        importlib.import_module(name)
    import setproctitle

    from forq.supervisor.child import run_child

    # initialise in the server what every child would otherwise redo after fork
    setproctitle.setproctitle("forq: fork server")
    supervisor_pid = os.getppid()
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != supervisor_pid:
        os._exit(0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    gc.collect()
    gc.freeze()
    me = os.getpid()
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            sock.send(pickle.dumps(("exit", pid, status, usage.ru_maxrss)))
        if sock in ready:
            msg, ancillary, _flags, _addr = sock.recvmsg(1 << 20, socket.CMSG_LEN(4))
            if not msg:
                os._exit(0)
            (result_fd,) = _fds(ancillary)
            spec, title = pickle.loads(msg)
            pid = os.fork()
            if pid == 0:
                sock.close()
                os.close(wake_r)
                os.close(wake_w)
                run_child(spec, result_fd, me, title)
            os.close(result_fd)
            pidfd = os.pidfd_open(pid)  # before any wait4 can reap it
            sock.sendmsg([pickle.dumps(("pid", pid))],
                          [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pidfd]))])
            os.close(pidfd)


def main() -> None:
    sys.path.insert(0, str(REPO))
    serve(socket.socket(fileno=int(sys.argv[1])), list(filter(None, sys.argv[2].split(","))))


if __name__ == "__main__":
    main()
