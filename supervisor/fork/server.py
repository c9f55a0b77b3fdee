"""The fork server: a lean process that forks job children for the supervisor.

    python -m forq.supervisor.fork.server FD      (settings in $FORQ_FORKSERVER, JSON)

Started by the supervisor at start-up, exec'd fresh so it does not share the
supervisor's 37 MiB heap (redis, metrics, the event loop) and holds nothing of it: no
Redis connection, no config, no password (its environment is scrubbed before the exec,
`environment.py`). It is the only process that imports the handler modules — their
top-level code is handler code — and it drops to `[sandbox].run_as` *before* importing
them. It then tells the supervisor which tasks exist (`protocol.describe`) and which code it
imported (`fingerprint.py`), freezes its heap, and forks each job's child. A fork from
it is cheaper for both sides, and the supervisor, which no longer forks, takes no
copy-on-write faults from its children.

FD is its end of a SOCK_SEQPACKET socketpair; `protocol` describes the messages.

Idle children forked in advance, so an idle machine's next job finds its fork: `spares`.

It dies with the supervisor (PR_SET_PDEATHSIG), and a child dies with it, spares
included; EOF on its socket (the supervisor closed it or died) ends it too. Every process
a job starts ends with the job and with the fork server, escapees included: it is a
child subreaper, kills what a job's tree leaves it, and when its supervisor dies ends
them all before it goes (`orphans`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from forq import registry
from forq.supervisor.fork import (
    fingerprint,
    hugepages,
    leanfork,
    namespaces,
    orphans,
    sandbox,
)
from forq.supervisor.fork.child import (
    PR_SET_PDEATHSIG,
    PRCTL,
    ChildSpec,
    run_child,
)
from forq.supervisor.fork.environment import restore, scrub_service_vars
from forq.supervisor.fork.protocol import RECV_MAX, exit_report, fds_of, read_memfd, send
from forq.supervisor.fork.protocol import describe as describe_tasks
from forq.supervisor.fork.spares import SERVER_TITLE, Spares

_CATCH_UP = 64  # requests read at most before a passed fencing deadline is judged


class Server:
    def __init__(self, sock: socket.socket, supervisor_pid: int, spares: int = 0,
                 set_title: Callable[[str], object] | None = None,
                 init_forks: bool = False, code: str = "", huge_pages: str = "") -> None:
        self.sock = sock
        self.code = code  # the fingerprint of the handler code it imported (`fingerprint`)
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
        self.set_title = set_title
        self.spares = Spares(spares, self.me, self.pidfd, self.title, self.close_own_fds)
        # monotonic time of the last request or reaped job (`refill` waits for quiet)
        self.busy_at = float("-inf")
        self.huge_pages = huge_pages  # what the heap is on (`hugepages.report`)
        # children of ours we did not fork for a job: what handler modules' top-level
        # code started (at `serve`), left alone; any other is a stray (`kill_strays`)
        self.own: set[int] = set()
        self.strays_at = 0.0  # monotonic time of the next look for strays while jobs run

    def serve(self, namespaces_problem: str | None = None,
              hidden: list[str] | None = None) -> None:
        table = describe_tasks(registry.registered())
        try:
            self.own = set(orphans.own_children())
        except OSError:
            pass
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # the supervisor decides when jobs stop; a terminal's ^C reaches the whole group
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        hello: dict[str, Any] = {"ready": self.me, "tasks": table, "code": self.code}
        if self.huge_pages:
            hello["huge_pages"] = self.huge_pages
        if namespaces_problem is not None:
            hello["namespaces"] = namespaces_problem  # "" when they work
        if hidden:
            hello["hidden"] = hidden  # files that read as empty for every job
        self.tell(hello)
        while True:
            refill = self.spares.refill(self.busy_at, bool(self.children),
                                        self.request_waiting)
            timeout = min((t for t in (refill, self.fence_timeout(), self.strays_timeout())
                           if t is not None), default=None)
            try:
                watched: list[Any] = [self.sock, self.wake_r]
                ready, _, _ = select.select(watched, [], [], timeout)
            except InterruptedError:
                continue
            caught_up = self.fence()  # may have read every waiting request: none is due
            if self.children and time.monotonic() >= self.strays_at:
                self.kill_strays()
            if self.wake_r in ready:
                try:
                    os.read(self.wake_r, 512)
                except BlockingIOError:
                    pass
            self.reap()
            if self.sock in ready and not caught_up:
                self.request()

    def tell(self, message: dict, fds: list[int] | None = None) -> None:
        """Send to the supervisor. If it has gone (it closed its end on the way out, and
        kills us next), end quietly, and every job's processes with us."""
        try:
            send(self.sock, message, fds)
        except OSError:
            orphans.end_every_child()

    def fence_timeout(self) -> float | None:
        if not self.fence_at:
            return None
        return max(0.0, min(self.fence_at.values()) - time.monotonic())

    def fence(self) -> bool:
        """Kill each child whose lease its supervisor could not prove in time (the
        supervisor does too, unless it is frozen); `reap` reports it. A deadline passed
        is judged after the updates waiting unread (True: it read some): it may be this
        process that was starved (a loaded VM), while its supervisor proved the lease."""
        now, catch_up = time.monotonic(), _CATCH_UP
        while (catch_up and any(at <= now for at in self.fence_at.values())
               and self.request_waiting()):
            self.request()
            now, catch_up = time.monotonic(), catch_up - 1
        for pid, deadline in list(self.fence_at.items()):
            if deadline <= now:
                del self.fence_at[pid]
                self.fenced.add(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        return catch_up < _CATCH_UP

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
        holds its pid, so the group id cannot have been reused), and what it left behind
        (ours now: `kill_strays`), then reaped. A spare that ended idle is reaped without
        a report: the supervisor never knew it; so is a stray."""
        strays_ended = False
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break
            if info is None or not info.si_pid:
                break
            pid = info.si_pid
            if pid not in self.children:
                strays_ended |= self.forget(pid)
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # no grandchild outlives its job
            self.kill_strays()  # its orphans, re-parented to us as it exited
            _, status, usage = os.wait4(pid, 0)
            self.busy_at = time.monotonic()
            self.children.discard(pid)
            self.fence_at.pop(pid, None)
            exit_message = exit_report(pid, status, usage)
            if pid in self.fenced:
                self.fenced.discard(pid)
                exit_message["fenced"] = True
            self.tell(exit_message)
        if strays_ended:  # the orphans of a stray are ours now too
            self.kill_strays()

    def strays_timeout(self) -> float | None:
        if not self.children:
            return None
        return max(0.0, self.strays_at - time.monotonic())

    def kill_strays(self) -> None:
        """SIGKILL each child of ours that is neither a job's child, a spare, nor our own
        from before `serve` (`orphans.kill_strays`); `reap` reaps it as it ends."""
        self.strays_at = time.monotonic() + orphans.STRAY_SCAN
        orphans.kill_strays(lambda pid: pid in self.children or self.spares.ours(pid)
                            or pid in self.own)

    def forget(self, pid: int) -> bool:
        """Reap a child that ran no job: a spare that ended before it was given one
        (killed, or dismissed), or a stray (True)."""
        os.waitpid(pid, 0)
        self.own.discard(pid)
        return not self.spares.forget(pid)

    def request_waiting(self) -> bool:
        waiting, _, _ = select.select([self.sock], [], [], 0)
        return bool(waiting)

    def request(self) -> None:
        self.busy_at = time.monotonic()
        try:
            data, ancillary, flags, _ = self.sock.recvmsg(RECV_MAX, socket.CMSG_SPACE(12))
        except (ConnectionResetError, BrokenPipeError):
            orphans.end_every_child()
        fds = fds_of(ancillary)
        if not data:  # the supervisor is gone (or closed us): the children go too
            orphans.end_every_child()
        result_fd = fds[0] if fds else -1
        output_fd = fds[1] if len(fds) > 1 else -1
        try:
            message = json.loads(data)
            if isinstance(message, dict) and "fence" in message and not fds:
                self.update_fences(message["fence"])
                return
            if isinstance(message, dict) and "retire" in message and not fds:
                self.spares.retire()
                return
            inline = not message.get("memfd")
            if not inline:
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
        if inline:
            self.spares.last_request = data
        try:
            # a namespaced child's fork depends on its job: it cannot be made in advance
            pid = self.spares.hand(data, [result_fd, output_fd]) \
                if inline and not spec.namespaces and self.spares.fits(spec) else None
            if pid is None:
                pid = self.fork(spec, result_fd, output_fd, title)
        except OSError as exc:
            self.tell({"error": f"fork failed: {exc}"})
            return
        finally:
            os.close(result_fd)
            os.close(output_fd)
        self.started(pid, fence_at)

    def started(self, pid: int, fence_at: float | None) -> None:
        """`pid` runs a job now: watch its fencing deadline and tell the supervisor."""
        self.children.add(pid)
        if fence_at is not None:
            self.fence_at[pid] = float(fence_at)
        pidfd = os.pidfd_open(pid)  # before reap() can run: the pid is still ours
        try:
            self.tell({"pid": pid}, [pidfd])
        finally:
            os.close(pidfd)

    def fork(self, spec: ChildSpec, result_fd: int, output_fd: int, title: str) -> int:
        """Fork a child for this job now (raises OSError if the fork fails)."""
        pid = self.fork_child(spec)
        if pid == 0:  # the child: never returns
            self.close_in_child()
            run_child(spec, result_fd, self.me, title, output_fd, self.pidfd)
        return pid

    def fork_child(self, spec: ChildSpec) -> int:
        """Fork for one job (`leanfork`: without Python's after-fork hooks when they have
        nothing to do): as PID 1 of a PID namespace of its own when the job gets
        namespaces and we may make them (else the child makes its own, the slower way:
        `namespaces.enter`)."""
        if spec.namespaces and self.init_forks:
            try:
                return namespaces.fork_as_init()
            except namespaces.NamespaceError:
                pass
        return leanfork.fork()

    def close_in_child(self) -> None:
        """In a child just forked: close what is the server's (`close_own_fds`) and
        every spare's socket."""
        self.close_own_fds()
        self.spares.close_in_child()

    def close_own_fds(self) -> None:
        """In a child just forked: close the server's socket to the supervisor and its
        wake-up pipe (no signal of ours may write to that fd number once it is reused)."""
        signal.set_wakeup_fd(-1)
        self.sock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    def title(self, text: str) -> None:
        if self.set_title is not None:
            try:
                self.set_title(text)
            except Exception:  # noqa: BLE001 — a title is cosmetic
                pass


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
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != supervisor_pid:
        os._exit(0)
    # before any handler code: whether a child may skip Python's after-fork hooks
    leanfork.watch_registrations()
    # what handler modules, then jobs, leave behind is ours, not init's (`orphans`)
    orphans.become_subreaper(PRCTL)
    settings = json.loads(os.environ.pop("FORQ_FORKSERVER", "{}"))
    # the supervisor's import path, so handler modules resolve as they did there
    if settings.get("path"):
        sys.path[:] = settings["path"]
    try:  # before any handler code
        problem, init_forks, hidden = sandbox.enter(settings, sock.fileno())
    except sandbox.RunAsRefused as exc:
        _fail(sock, str(exc))
    for name in settings.get("imports", []):
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 — any failure of handler code at import
            failed = str(getattr(exc, "name", "") or "") if isinstance(exc, ImportError) else ""
            _fail(sock, f"cannot import handler module {name}: {type(exc).__name__}: {exc}",
                  failed or name)
    registry.preload_runtime()
    # once, before the first fork: what code its jobs run (a label, never a failure)
    code = fingerprint.fingerprint(settings.get("imports", []))
    scrub_service_vars()
    set_title: Callable[[str], object] | None = None
    try:
        import setproctitle

        # initialised here once: a child that had to import and set it up itself
        # would pay ≈ 4 ms CPU more per job
        setproctitle.setproctitle(SERVER_TITLE)
        set_title = setproctitle.setproctitle
    except Exception:  # noqa: BLE001 — a title is cosmetic
        pass
    restore(settings.get("restore_env"))
    gc.collect()
    gc.freeze()  # the children's collectors never walk (so never copy) these objects
    orphans.end_with_supervisor(supervisor_pid, PRCTL)
    huge_pages = settings.get("huge_pages") is not False
    # last, on the heap as the handler modules left it: every fork copies its page table
    pages = hugepages.report(huge_pages, hugepages.collapse() if huge_pages else "")
    spares = settings.get("spares", 0)
    Server(sock, supervisor_pid, spares if isinstance(spares, int) else 0,
           set_title, init_forks, code, pages).serve(problem, hidden)


if __name__ == "__main__":
    main(sys.argv[1:])
