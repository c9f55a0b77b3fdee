"""Spawner: fork each job's child, and report each child's end, whoever forked it.

Children are forked by the lean fork server (`fork/`), the only process that imports
the handler modules; the supervisor never runs handler code, and learns which tasks
exist from the fork server (`tasks`). When `[supervisor].fork_server` is off, when the
fork server cannot start, or after it was lost more than `MAX_LOSSES` times in a minute
(a crash loop must not stop the jobs), each child is a fresh interpreter exec'd by the
supervisor (`fork.oneshot`), never a fork of it: its memory holds the Redis password.
Either way the end of a child reaches `on_exit(child, status, peak_rss, cause)` from
the event loop: the fork server's exit report, or the child's pidfd becoming readable.

A fork server that dies takes its children with it (PR_SET_PDEATHSIG): each ends as a
crash — or with its result, if it had written one — and a new fork server takes over;
what their jobs left behind comes to the supervisor, which ends it (`strays`), as it
ends what a child exec'd alone leaves.
A reload starts a new fork server, which imports the handler modules afresh; the old
one forks no more, lets its spare children go at once (`ForkServer.retire`), and stops
when its last child ends: running jobs finish in the code they started with. If the
new one cannot start, the old one goes on serving (`replace`).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable

from forq.queue import Lease
from forq.supervisor.children.running import KillReason, RunningChild
from forq.supervisor.children.strays import Strays
from forq.supervisor.fork.alone import spawn
from forq.supervisor.fork.child import ChildSpec
from forq.supervisor.fork.client import (
    READY_TIMEOUT,
    ForkServer,
    ForkServerError,
    ForkServerFatal,
)
from forq.supervisor.fork.environment import Launch
from forq.supervisor.fork.protocol import TaskInfo
from forq.supervisor.loop.eventloop import EventLoop

log = logging.getLogger("forq.supervisor")

MAX_LOSSES = 5  # fork servers lost within a minute before the supervisor forks itself
ORPHAN_GRACE = 2.0  # how long a lost fork server's children get to finish dying

OnExit = Callable[[RunningChild, int, int, str], None]


class Spawner:
    def __init__(self, loop: EventLoop, children: Callable[[], Iterable[RunningChild]],
                 on_exit: OnExit,
                 while_waiting: tuple[float, Callable[[], object]] | None = None,
                 running: Callable[[], bool] = lambda: False) -> None:
        self.loop = loop
        self.children = children  # every running child, whoever forked it
        self.on_exit = on_exit
        self.server: ForkServer | None = None
        self.retiring: list[ForkServer] = []
        self.losses: list[float] = []  # monotonic times
        self.given_up = False
        self.launch = Launch()
        self.enabled = False
        # the registered tasks, from the last fork server that started (None: not known,
        # every task is forked and a child of an unknown one reports it)
        self.tasks: dict[str, TaskInfo] | None = None
        # why jobs cannot have namespaces of their own ("" they can; None: not asked)
        self.namespaces_problem: str | None = None
        self.hidden: tuple[str, ...] = ()  # files no job can read (`ForkServer.hidden`)
        self.accepting = True  # False once draining: a lost server is not replaced
        # (every, call): what goes on while a new fork server starts (lease extension)
        self.while_waiting = while_waiting
        # a reload's new fork server while it imports: (server, enabled, on_done, timer)
        self.starting: tuple[ForkServer, bool, Callable[[ForkServerError | None], None],
                             list] | None = None
        # what a job leaves behind that no fork server ended (`strays`)
        self.strays = Strays(loop, self._servers_here, self._alone_here, running)

    def _servers_here(self) -> list[int]:
        """The pids of the fork servers the supervisor started (each its `proc`: the
        process it exec'd; one still starting too)."""
        starting = [self.starting[0]] if self.starting is not None else []
        return [s.pid for s in [self.server, *self.retiring, *starting] if s is not None]

    def _alone_here(self) -> list[int]:
        """The pids of the job children the supervisor exec'd alone."""
        return [c.pid for c in self.children() if not c.forked_by_server]

    def configure(self, enabled: bool, launch: Launch) -> None:
        """At start: the fork server (and the task table), waited for. Raises
        ForkServerFatal if it cannot start for a reason a retry would meet again (a
        handler module that does not import)."""
        server = self._new_server(launch)
        self.enabled, self.launch = enabled, launch
        if server is not None:
            self._serve(server)

    def replace(self, enabled: bool, launch: Launch,
                on_done: Callable[[ForkServerError | None], None]) -> None:
        """A reload: start a new fork server, which imports the handler modules afresh
        from disk, without waiting for it — the one serving now goes on forking jobs
        meanwhile. Once it is up, `on_done(None)`: jobs fork from the new one from then
        on, and the old one stays for its running children and stops with the last
        (`_retire`). If it does not start, `on_done(error)`: nothing changed, the old
        one goes on serving. A reload while one starts supersedes it."""
        self._abandon_start()
        try:
            server = ForkServer(launch, wait=False)
        except ForkServerError as exc:
            on_done(exc)
            return
        timer = self.loop.timers.schedule(
            READY_TIMEOUT, lambda: self._start_failed(ForkServerError(
                f"no answer in {READY_TIMEOUT:g}s")))
        self.starting = (server, enabled, on_done, timer)
        self.loop.add_reader(server.sock, lambda _s, _m: self._on_started())
        self.loop.add_reader(server.output, lambda _f, _m: self._on_output(server))

    def _on_started(self) -> None:
        if self.starting is None:
            return
        server, enabled, on_done, timer = self.starting
        try:
            if not server.finish_start():
                return
        except ForkServerError as exc:
            self._start_failed(exc)
            return
        self.loop.timers.cancel(timer)
        self.starting = None
        self._unwatch(server)
        self.enabled, self.launch = enabled, server.launch
        self.given_up, self.losses = False, []  # an operator's reload: a fresh start
        self._retire()
        self._serve(server)
        on_done(None)

    def _start_failed(self, exc: ForkServerError) -> None:
        if self.starting is None:
            return
        on_done = self.starting[2]
        self._abandon_start()
        on_done(exc)

    def _abandon_start(self) -> None:
        if self.starting is not None:
            server, _enabled, _on_done, timer = self.starting
            self.starting = None
            self.loop.timers.cancel(timer)
            self._unwatch(server)
            server.close()

    def _serve(self, server: ForkServer) -> None:
        """A fork server that started: its task table; it forks the jobs from now on,
        unless fork_server is off (then it was asked for its table only)."""
        self.tasks, self.namespaces_problem = server.tasks, server.namespaces_problem
        self.hidden = server.hidden
        if self.enabled:
            self._take(server)
        else:  # each child is exec'd alone
            server.close()

    def _new_server(self, launch: Launch) -> ForkServer | None:
        try:
            return ForkServer(launch, while_waiting=self.while_waiting)
        except ForkServerFatal:
            raise
        except ForkServerError as exc:
            log.error("fork server did not start (%s); starting each job's child alone "
                      "instead", exc)
            return None

    @property
    def code(self) -> str:
        """The handler code the jobs started now run, as job records name it: the fork
        server's fingerprint with `[supervisor].version` (`fingerprint.code_name`); the
        version alone without a fork server (a child started alone imports whatever is
        on disk when it starts)."""
        return self.server.code if self.server is not None else self.launch.version

    def retiring_codes(self) -> list[tuple[int, str, int]]:
        """(pid, code, running children) of each old fork server still up."""
        return [(server.pid, server.code, len(self._of(server))) for server in self.retiring]

    def known(self, task: str) -> TaskInfo | None:
        """The task's registration, if the handler modules register it. With no table
        (no fork server ever started) every task counts as known: its child says."""
        if self.tasks is None:
            return TaskInfo(task)
        return self.tasks.get(task)

    def task_info(self, task: str) -> TaskInfo | None:
        return self.tasks.get(task) if self.tasks is not None else None

    def start(self) -> None:
        """Start the fork server; if it cannot start, children are exec'd alone."""
        if not self.enabled or self.server is not None or self.given_up:
            return
        try:
            server = self._new_server(self.launch)
        except ForkServerFatal as exc:  # it imported at start: a module changed on disk
            log.error("fork server did not start (%s); starting each job's child alone "
                      "instead", exc)
            return
        if server is not None:
            self._serve(server)

    def _take(self, server: ForkServer) -> None:
        self.server = server
        self.loop.add_reader(server.sock, lambda _s, _m: self._on_readable(server))
        if server.output >= 0:
            self.loop.add_reader(server.output, lambda _f, _m: self._on_output(server))
        log.info("fork server started in pid %d (code %s)%s", server.pid, server.code,
                 f": {server.huge_pages}" if server.huge_pages else "")

    def _on_output(self, server: ForkServer) -> None:
        if server.output < 0:  # closed earlier in this loop turn (the server was lost)
            return
        if not server.read_output():
            self.loop.remove_reader(server.output)
            os.close(server.output)
            server.output = -1

    def _unwatch(self, server: ForkServer) -> None:
        self.loop.remove_reader(server.sock)
        if server.output >= 0:
            self.loop.remove_reader(server.output)

    def spawn(self, lease: Lease, spec: ChildSpec, *, title: str, timeout: float,
              fence_at: float | None = None) -> RunningChild:
        """`fence_at` (monotonic): the fork server kills the child then, unless `fence`
        moves it on (a child forked here has no such guard)."""
        self.strays.hurry()  # what it may leave is swept at the fast pace while it runs
        for _attempt in range(2):  # a lost fork server is replaced once, then forked here
            server = self.server
            if server is None:
                break
            try:
                child = server.spawn(lease, spec, title=title, timeout=timeout,
                                     fence_at=fence_at)
            except ForkServerError as exc:
                self._lost(server, exc)
                continue
            if server.pending_exits:  # other children's exits read while waiting
                self.loop.timers.schedule(0, functools.partial(self._dispatch_exits, server))
            return child
        child = spawn(lease, spec, title=title, timeout=timeout, launch=self.launch)
        self.loop.add_reader(child.pidfd, lambda _f, _m: self._reap_here(child))
        return child

    def fence(self, deadlines: Iterable[tuple[RunningChild, float]]) -> None:
        """Tell each fork server its children's new fencing deadlines: it kills them past
        those if this supervisor is frozen and cannot (see fork/protocol.py)."""
        by_server: dict[int, list[tuple[int, float]]] = {}
        for child, at in deadlines:
            if child.forked_by_server:
                by_server.setdefault(child.server, []).append((child.server_pid, at))
        for server in [self.server, *self.retiring]:
            if server is not None and server.pid in by_server:
                server.fence(by_server[server.pid])

    def close(self) -> None:
        self._abandon_start()
        for server in [*self.retiring, self.server]:
            if server is not None:
                self._unwatch(server)
                server.close()
        self.server, self.retiring = None, []
        self.strays.sweep()

    # -- ends of children ------------------------------------------------------------

    def _reap_here(self, child: RunningChild) -> None:
        """A child forked here exited (its pidfd is readable)."""
        # the job's whole process group goes with it: no grandchild outlives its job
        child.signal_group(signal.SIGKILL)
        _, status, usage = os.wait4(child.pid, 0)
        self.loop.remove_reader(child.pidfd)
        child.cpu_us = (int(usage.ru_utime * 1e6), int(usage.ru_stime * 1e6))
        self.on_exit(child, status, usage.ru_maxrss * 1024, "")
        self.strays.sweep()  # what it left is ours now: it had no fork server to end it

    def _on_readable(self, server: ForkServer) -> None:
        try:
            server.drain()
        except ForkServerError as exc:
            self._lost(server, exc)
            return
        self._dispatch_exits(server)

    def _of(self, server: ForkServer) -> list[RunningChild]:
        return [c for c in self.children() if c.server == server.pid]

    def _dispatch_exits(self, server: ForkServer) -> None:
        while server.pending_exits:
            pid, status, peak, fenced, utime_us, stime_us = server.pending_exits.pop(0)
            child = next((c for c in self._of(server) if c.server_pid == pid), None)
            if child is not None:
                child.cpu_us = (utime_us, stime_us)
                if fenced and child.kill_reason is None:
                    log.warning("job %s %s: lease not confirmed in time, its fork server "
                                "killed its child", child.job_id, child.task)
                    child.kill_reason = KillReason.LEASE_LOST
                self.on_exit(child, status, peak, "")
        if server in self.retiring and not self._of(server):
            self.retiring.remove(server)
            self._unwatch(server)
            server.close()
            self.strays.sweep()
            log.info("old fork server %d stopped", server.pid)

    def _retire(self) -> None:
        """Fork no more from the current fork server; stop it when its children end."""
        server, self.server = self.server, None
        if server is None:
            return
        running = len(self._of(server))
        if running:
            server.retire()  # its spares go now, it stays for its running children
            self.retiring.append(server)
            log.info("old fork server %d (code %s) forks no more; it stops when its %d "
                     "running job(s) end", server.pid, server.code, running)
        else:
            self._unwatch(server)
            server.close()

    def _lost(self, server: ForkServer, exc: Exception) -> None:
        self._unwatch(server)
        self._dispatch_exits(server)  # the exits it reported before it went
        orphans = self._of(server)
        server.close()
        if self.server is server:
            self.server = None
        if server in self.retiring:
            self.retiring.remove(server)
        log.error("fork server %d lost (%s); %d running job(s) die with it", server.pid, exc,
                  len(orphans))
        end_orphans(orphans, f"its fork server was lost ({exc})", self.on_exit)
        self.strays.sweep()  # what its jobs left, which it could not end
        now = time.monotonic()
        self.losses = [t for t in self.losses if now - t < 60] + [now]
        if len(self.losses) > MAX_LOSSES:
            log.error("fork server lost %d times in a minute: starting each job's child "
                      "alone from now on", len(self.losses))
            self.given_up = True
            return
        if self.accepting:
            self.start()


def end_orphans(orphans: list[RunningChild], cause: str, on_exit: OnExit) -> None:
    """The children of a lost fork server: each dies with it (its death signal), given
    ORPHAN_GRACE to finish dying, then killed; each ends with its result if it wrote a
    whole one before (its exit status died with the fork server), else as a crash."""
    deadline = time.monotonic() + ORPHAN_GRACE
    for child in orphans:
        if not child.wait_exit(max(0.0, deadline - time.monotonic())):
            child.signal_group(signal.SIGKILL)
            child.wait_exit(1.0)
        if child.pipe_open:
            child.read_pipe()
        status = 0 if child.report() is not None else signal.SIGKILL
        on_exit(child, status, 0, cause)
