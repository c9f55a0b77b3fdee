"""The fork server: a lean process that forks job children for the supervisor.

    python -m forq.supervisor.fork.server FD      (settings in $FORQ_FORKSERVER, JSON)

Started by the supervisor at start-up, exec'd fresh so it does not share the
supervisor's 37 MiB heap (redis, metrics, the event loop) and holds nothing of it: no
Redis connection, no config, no password (its environment is scrubbed before the exec,
`environment.py`). It is the only process that imports the handler modules — their
top-level code is handler code — and it drops to `[sandbox].run_as` *before* importing
them. It then tells the supervisor which tasks exist (`tasks.py`), freezes its heap,
and forks each job's child. A fork from it is cheaper for both sides, and the
supervisor, which no longer forks, takes no copy-on-write faults from its children.

FD is its end of a SOCK_SEQPACKET socketpair; `protocol` describes the messages.

It dies with the supervisor (PR_SET_PDEATHSIG), and a child dies with it; EOF on its
socket (the supervisor closed it or died) ends it too.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any

from forq import registry
from forq.supervisor.fork import namespaces, sandbox, tasks
from forq.supervisor.fork.child import _PRCTL, PR_SET_PDEATHSIG, ChildSpec, run_child
from forq.supervisor.fork.protocol import RECV_MAX, fds_of, read_memfd, send


class Server:
    def __init__(self, sock: socket.socket, supervisor_pid: int,
                 init_forks: bool = False) -> None:
        self.sock = sock
        self.supervisor_pid = supervisor_pid
        self.me = os.getpid()
        # readable once we exit: how a child that is PID 1 of its own namespace (no
        # parent pid to compare) checks that we did not die before it asked to die with us
        self.pidfd = os.pidfd_open(self.me)
        # a job that gets namespaces is forked as PID 1 of its own (`fork_as_init`)
        self.init_forks = init_forks
        self.wake_r, self.wake_w = os.pipe()
        self.children: set[int] = set()
        # pid -> monotonic fencing deadline (see `protocol`); pids killed for it
        self.fence_at: dict[int, float] = {}
        self.fenced: set[int] = set()

    def serve(self, namespaces_problem: str | None = None) -> None:
        table = tasks.describe(registry.registered())
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # the supervisor decides when jobs stop; a terminal's ^C reaches the whole group
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        hello: dict[str, Any] = {"ready": self.me, "tasks": table}
        if namespaces_problem is not None:
            hello["namespaces"] = namespaces_problem  # "" when they work
        self.tell(hello)
        while True:
            try:
                watched: list[Any] = [self.sock, self.wake_r]
                ready, _, _ = select.select(watched, [], [], self.fence_timeout())
            except InterruptedError:
                continue
            self.fence()
            if self.wake_r in ready:
                try:
                    os.read(self.wake_r, 512)
                except BlockingIOError:
                    pass
            self.reap()
            if self.sock in ready:
                self.request()

    def tell(self, message: dict, fds: list[int] | None = None) -> None:
        """Send to the supervisor. If it has gone (it closed its end on the way out, and
        kills us next), end quietly: our children die with us (PR_SET_PDEATHSIG)."""
        try:
            send(self.sock, message, fds)
        except OSError:
            os._exit(0)

    def fence_timeout(self) -> float | None:
        if not self.fence_at:
            return None
        return max(0.0, min(self.fence_at.values()) - time.monotonic())

    def fence(self) -> None:
        """Kill each child whose lease its supervisor could not prove in time (the
        supervisor does too, unless it is frozen); `reap` reports it."""
        now = time.monotonic()
        for pid, deadline in list(self.fence_at.items()):
            if deadline <= now:
                del self.fence_at[pid]
                self.fenced.add(pid)
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def update_fences(self, entries: object) -> None:
        """{"fence": [[pid, deadline], ...]}: new deadlines for our own children only."""
        if not isinstance(entries, list):
            return
        for entry in entries:
            if (isinstance(entry, list) and len(entry) == 2 and entry[0] in self.fence_at
                    and isinstance(entry[1], (int, float))):
                self.fence_at[entry[0]] = float(entry[1])

    def reap(self) -> None:
        """Report every exited child: its group SIGKILLed first (while the zombie still
        holds its pid, so the group id cannot have been reused), then reaped. As PID 1
        of a namespace of our own (`namespaces.become_init`) we also inherit what a job
        left behind when it ran without namespaces: reaped, never reported."""
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or not info.si_pid:
                return
            pid = info.si_pid
            if pid not in self.children:
                os.waitpid(pid, 0)
                continue
            try:
                os.killpg(pid, signal.SIGKILL)  # no grandchild outlives its job
            except (ProcessLookupError, PermissionError):
                pass
            _, status, usage = os.wait4(pid, 0)
            self.children.discard(pid)
            self.fence_at.pop(pid, None)
            exit_message = {"exit": pid, "status": status, "maxrss": usage.ru_maxrss}
            if pid in self.fenced:
                self.fenced.discard(pid)
                exit_message["fenced"] = True
            self.tell(exit_message)

    def request(self) -> None:
        try:
            data, ancillary, flags, _ = self.sock.recvmsg(RECV_MAX, socket.CMSG_SPACE(12))
        except (ConnectionResetError, BrokenPipeError):
            os._exit(0)
        fds = fds_of(ancillary)
        if not data:  # the supervisor is gone (or closed us): the children go too
            os._exit(0)
        result_fd = fds[0] if fds else -1
        output_fd = fds[1] if len(fds) > 1 else -1
        try:
            message = json.loads(data)
            if isinstance(message, dict) and "fence" in message and not fds:
                self.update_fences(message["fence"])
                return
            if message.get("memfd"):
                message["spec"] = json.loads(read_memfd(fds[2]))
            spec = ChildSpec(**message["spec"])
            title = message["title"]
            fence_at = message.get("fence_at")
            if fence_at is not None and not isinstance(fence_at, (int, float)):
                raise ValueError("fence_at is not a number")
            if output_fd < 0 or flags & socket.MSG_TRUNC:
                raise ValueError("malformed request")
        except (ValueError, TypeError, KeyError, IndexError, OSError) as exc:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.tell({"error": f"bad request: {exc}"})
            return
        try:
            pid = self.fork_child(spec)
        except OSError as exc:
            os.close(result_fd)
            os.close(output_fd)
            self.tell({"error": f"fork failed: {exc}"})
            return
        if pid == 0:  # the child: never returns
            self.sock.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            run_child(spec, result_fd, self.me, title, output_fd, self.pidfd)
        os.close(result_fd)
        os.close(output_fd)
        self.children.add(pid)
        if fence_at is not None:
            self.fence_at[pid] = float(fence_at)
        pidfd = os.pidfd_open(pid)  # before reap() can run: the pid is still ours
        try:
            self.tell({"pid": pid}, [pidfd])
        finally:
            os.close(pidfd)


    def fork_child(self, spec: ChildSpec) -> int:
        """`os.fork()` for one job: as PID 1 of a PID namespace of its own when the job
        gets namespaces and we may make them (else the child makes its own, the slower
        way: `namespaces.enter`)."""
        if spec.namespaces and self.init_forks:
            try:
                return namespaces.fork_as_init()
            except namespaces.NamespaceError:
                pass
        return os.fork()


def _fail(sock: socket.socket, why: str, module: str = "") -> None:
    """Start-up failed: say why in one message (the supervisor logs it and exits 2)."""
    try:
        send(sock, {"fatal": why[:4000], "module": module[:300]})
    except OSError:
        pass
    os._exit(2)


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    sock.set_inheritable(False)
    supervisor_pid = os.getppid()
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != supervisor_pid:
        os._exit(0)
    settings = json.loads(os.environ.pop("FORQ_FORKSERVER", "{}"))
    # the supervisor's import path, so handler modules resolve as they did there
    if settings.get("path"):
        sys.path[:] = settings["path"]
    try:
        sandbox.prepare()  # what a child needs later and a dropped user may not reach
        if settings.get("run_as"):
            sandbox.drop_to(settings["run_as"])
    except (OSError, KeyError) as exc:
        _fail(sock, f"cannot switch to [sandbox].run_as {settings['run_as']!r}: "
                    f"{getattr(exc, 'strerror', None) or exc} (the supervisor runs as uid "
                    f"{os.getuid()}; run_as needs root, or CAP_SETUID and CAP_SETGID)")
    # before any handler code: can this user give a job namespaces of its own?
    probe = settings.get("probe")
    if probe and os.geteuid() != 0:
        try:  # unprivileged: the privilege to make a PID namespace per job, in our own
            namespaces.become_init(sock.fileno())
        except OSError:
            pass  # no user namespaces for us: the probe says whether jobs can have any
    problem, init_forks = sandbox.probe_namespaces(**probe) if probe else (None, False)
    for name in settings.get("imports", []):
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 — any failure of handler code at import
            failed = str(getattr(exc, "name", "") or "") if isinstance(exc, ImportError) else ""
            _fail(sock, f"cannot import handler module {name}: {type(exc).__name__}: {exc}",
                  failed or name)
    registry.preload_runtime()
    try:
        import setproctitle

        # initialised here once: a child that had to import and set it up itself
        # would pay ≈ 4 ms CPU more per job
        setproctitle.setproctitle("forq: fork server")
    except Exception:  # noqa: BLE001 — a title is cosmetic
        pass
    gc.collect()
    gc.freeze()  # the children's collectors never walk (so never copy) these objects
    Server(sock, supervisor_pid, init_forks).serve(problem)


if __name__ == "__main__":
    main(sys.argv[1:])
