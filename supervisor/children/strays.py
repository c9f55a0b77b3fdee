"""The supervisor as the last subreaper: what a job leaves behind when its fork server
is gone, or when there is none, ends too.

The fork server ends whatever a job's tree leaves it (`fork.orphans`), and when its
supervisor dies it ends them all first. But a fork server can die before it could do
so — SIGKILLed by the OOM killer, or by a job of its own user (under `run_as`, a job
may signal it) — and then its job children die (PR_SET_PDEATHSIG) and leave their
orphans to the next subreaper up. Children exec'd alone (`[supervisor].fork_server =
false`, `fork.oneshot`) have no fork server at all. So the supervisor is a child
subreaper too (`Strays.adopt`, from `Supervisor.run`: never in a process that merely
builds a supervisor, such as a test's), and every child of its own that is neither a
fork server nor a job child it started is SIGKILLed: when a fork server is lost, when a
child it started ends, and every `orphans.STRAY_SCAN` while jobs run and for `LINGER`
seconds after such an event (strays appear then); every `timers.IDLE_INTERVAL` when
idle, so that an idle supervisor does not wake 20 times a second for nothing. A launch
hurries the sweep back to its fast pace (`hurry`). Each one killed is watched by its
pidfd and reaped when it ends (its own children are ours then: the next sweep).

It cannot help when the supervisor itself is SIGKILLed: with no fork server, the
processes such a job left are init's (the start-up line says so: `job_processes`).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable

from forq.supervisor.fork import orphans
from forq.supervisor.fork.child import PRCTL
from forq.supervisor.loop.eventloop import EventLoop
from forq.supervisor.loop.timers import Ticker

log = logging.getLogger("forq.supervisor")

# Sweeps at the fast pace for this long after the last job child ran, ended, or a fork
# server was lost: the orphans of a dying tree come to us within the lost fork server's
# ORPHAN_GRACE, which `Spawner._lost` waits out before its own sweep
LINGER = 2.0


class Strays:
    def __init__(self, loop: EventLoop, servers: Callable[[], Iterable[int]],
                 alone: Callable[[], Iterable[int]],
                 running: Callable[[], bool] = lambda: False) -> None:
        self.loop = loop
        # the pids of the children we started: fork servers (a few), and the job
        # children exec'd alone, asked only when a child is not a fork server (a walk
        # over the job table: 1,000 children 20 times a second was 5% of the CPU)
        self.servers = servers
        self.alone = alone
        self.running = running  # does any job child run now
        self.active = False  # a subreaper: orphans come to us (`adopt`)
        self.watched: dict[int, int] = {}  # stray pid -> its pidfd, until reaped
        self.ticker: Ticker | None = None
        self.quiet_from = 0.0  # monotonic: no job ran nor ended since, at the fast pace

    def hurry(self) -> None:
        """A job child is launched: sweep at the fast pace from now on."""
        if self.ticker is not None:
            self.ticker.hurry()

    def adopt(self) -> None:
        """Become a child subreaper and sweep on a timer from now on."""
        if self.active or not orphans.become_subreaper(PRCTL):
            return
        self.active = True
        self.ticker = self.loop.timers.every(orphans.STRAY_SCAN, self._scan, idle=self._idle)

    def _idle(self) -> bool:
        if self.running() or self.watched:
            self.quiet_from = time.monotonic() + LINGER
            return False
        return time.monotonic() >= self.quiet_from

    def sweep(self) -> None:
        """A child ended, or a fork server was lost: strays may come now and in the next
        `LINGER` seconds."""
        self.quiet_from = time.monotonic() + LINGER
        self.hurry()
        self._scan()

    def _scan(self) -> None:
        """SIGKILL every child of ours we did not start: a pid stays ours until we reap
        it, so none is another process's."""
        if not self.active:
            return
        try:
            children = orphans.own_children()
        except OSError as exc:
            log.error("cannot list the supervisor's children to end what jobs left: %s", exc)
            return
        servers = set(self.servers())
        unknown = [pid for pid in children if pid not in servers and pid not in self.watched]
        if not unknown:
            return
        alone = set(self.alone())
        for pid in unknown:
            if pid in alone:
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue  # reaped meanwhile
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except OSError:
                pass
            self.watched[pid] = pidfd
            self.loop.add_reader(pidfd, functools.partial(self._reap, pid))

    def _reap(self, pid: int, _fd: object = None, _mask: int = 0) -> None:
        pidfd = self.watched.pop(pid)
        self.loop.remove_reader(pidfd)
        os.close(pidfd)
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        self.sweep()  # its children are ours now
