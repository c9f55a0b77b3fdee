"""Spares: idle children the fork server keeps forked in advance.

Up to `count` (the fork server's settings) idle children, each blocked reading a
socketpair of its own, so the fork — a few milliseconds of copying page tables, more
than anything else between a claim and the handler's first line — happens before the
job arrives rather than while the supervisor waits for the pid. A request that fits in
one datagram and wants no namespaces is handed to a spare: the same request bytes and
its two fds go down the spare's socket, and the spare runs `run_child` exactly as a
freshly forked child would (a namespaced child is forked for its job: how it is forked
depends on the job). Spares are forked again only once no job has run for a few
milliseconds (under load they cost more than they save: `Spares.refill`), and when no
request is waiting, so refilling never delays a job. An idle spare holds nothing of any
job (its own socket and stdio: the server's socket, wake-up pipe and the other spares'
sockets are closed in it), is titled `SPARE_TITLE`, and the supervisor never hears of
it until it runs a job: one that dies idle is reaped without an exit report, one that
reads EOF (the server retires, `{"retire": true}`) exits 0.
"""

from __future__ import annotations

import array
import json
import os
import socket
import time
from collections.abc import Callable
from typing import NoReturn

from forq.supervisor.fork import leanfork
from forq.supervisor.fork.child import (
    DEFAULT_PRIORITY,
    ChildSpec,
    Priority,
    detach,
    die_with_parent,
    priority_of,
    run_child,
)
from forq.supervisor.fork.protocol import RECV_MAX, fds_of
from forq.supervisor.fork.sandbox import preset_priority

SERVER_TITLE = "forq: fork server"
# an idle child's, set around its fork so it never shows the server's: tools that count
# the fork server's children as jobs (`forq.testing.supervisor`) can leave spares out
SPARE_TITLE = "forq: fork server: spare"
# no spare is forked until this long after the last job ended or was asked for: under
# load the next request comes sooner (a slot's claim, 1–2 ms), and on an idle
# supervisor 5 ms is well before a job is likely to come
QUIET_BEFORE_SPARES = 0.005


class Spares:
    def __init__(self, count: int, server_pid: int, server_pidfd: int,
                 title: Callable[[str], None],
                 close_server_fds: Callable[[], None]) -> None:
        self.count = count  # idle children to keep forked in advance
        self.server_pid = server_pid
        self.server_pidfd = server_pidfd
        self.title = title  # the server's process title (cosmetic)
        # in a spare just forked: close what is the server's (and the other spares')
        self.close_server_fds = close_server_fds
        self.idle: dict[int, socket.socket] = {}  # spare pid -> our end of its socket
        # the priority (nice, oom_score_adj) the spares preset: the last request's,
        # ChildSpec's defaults before any
        self.priority: Priority = DEFAULT_PRIORITY
        self.last_request = b""  # the last job's request, as it came (`rehearse`)
        self.dismissed: set[int] = set()  # spares told to go (EOF), not reaped yet
        self.retiring = False  # the supervisor forks no more here: no more spares

    def ours(self, pid: int) -> bool:
        """Whether `pid` is a spare, idle or told to go."""
        return pid in self.idle or pid in self.dismissed

    def forget(self, pid: int) -> bool:
        """A spare reaped (it ended idle, or was dismissed): True if `pid` was one."""
        sock = self.idle.pop(pid, None)
        if sock is not None:
            sock.close()
            return True
        if pid in self.dismissed:
            self.dismissed.discard(pid)
            return True
        return False

    def close_in_child(self) -> None:
        """In a child just forked: close every spare's socket."""
        for sock in self.idle.values():
            sock.close()

    def fits(self, spec: ChildSpec) -> bool:
        """Whether the spares' preset priority is this job's. If not, the spares go, and
        those forked next preset this one's: a niced process cannot be un-niced, nor
        its oom_score_adj lowered, without privileges a fork server may not have."""
        if priority_of(spec) == self.priority:
            return True
        self.priority = priority_of(spec)
        self.dismiss()
        return False

    def hand(self, request: bytes, fds: list[int]) -> int | None:
        """Give the request (already checked by the server) and its fds to an idle
        child; its pid, or None if there is no spare left to take it (one that died
        cannot)."""
        while self.idle:
            pid = next(iter(self.idle))
            sock = self.idle.pop(pid)
            try:
                sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                          array.array("i", fds))])
            except OSError:  # it died idle: the server's `reap` collects it, no report
                self.dismissed.add(pid)
                continue
            finally:
                sock.close()
            return pid
        return None

    def refill(self, busy_at: float, jobs_running: bool,
               request_waiting: Callable[[], bool]) -> float | None:
        """Fork spares up to `count`, but only once no job has run or been asked for
        for `QUIET_BEFORE_SPARES` (`busy_at`: monotonic time of the last), and while
        no request waits (a request is never delayed by a fork made for the next one).
        Returns how long until a refill may be due, None if none is.

        A spare is for the idle case, where a job's start waited for its fork. Under
        load it costs: while a spare lives, every page we write is copied for it
        (measured: 0.7 ms of children's CPU a job, 10% of the no-op throughput, at
        concurrency 2, when spares were kept while jobs ran), and a job handed to one
        pays a second decoding and the rehearsals. It saves no time there either: a
        slot's next job is claimed only when the last one ended, and on a busy machine
        the CPU a spare's set-up takes "in advance" is taken from the running jobs."""
        if len(self.idle) >= self.count or self.retiring or jobs_running:
            return None
        quiet_for = time.monotonic() - busy_at
        if quiet_for < QUIET_BEFORE_SPARES:
            return QUIET_BEFORE_SPARES - quiet_for
        while len(self.idle) < self.count:
            if request_waiting() or not self.fork_one():
                return None
            rehearse(self.last_request)
        return None

    def fork_one(self) -> bool:
        """Fork one idle child (False if the fork failed: try again on the next turn)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.title(SPARE_TITLE)  # it is a spare from its first instruction on
        try:
            pid = leanfork.fork()
        except OSError:
            pid = -1
        if pid == 0:
            ours.close()
            self.close_server_fds()
            self.close_in_child()
            wait_for_job(theirs, self.server_pid, self.server_pidfd, self.priority,
                         self.last_request)
        self.title(SERVER_TITLE)
        theirs.close()
        if pid < 0:
            ours.close()
            return False
        self.idle[pid] = ours
        return True

    def retire(self) -> None:
        """The supervisor forks no more here (a reload replaced the server): the spares
        go now, and no more are forked."""
        self.retiring = True
        self.dismiss()

    def dismiss(self) -> None:
        for pid, sock in self.idle.items():
            sock.close()  # EOF: it exits 0, and the server's `reap` collects it
            self.dismissed.add(pid)
        self.idle.clear()


def rehearse(request: bytes) -> None:
    """Decode a request as a job's would be, and drop it. A spare shares every page with
    its fork server, and the first write to one on either side copies it: decoding a
    request paid 0.2-0.3 ms of such faults on each side. Done on both sides right after
    a spare's fork, with the last request, those pages are copied while idle, not while
    a job waits."""
    if request:
        try:
            ChildSpec(**json.loads(request)["spec"])
        except Exception:  # noqa: BLE001 — a rehearsal: the job's own decoding is checked
            pass


def wait_for_job(sock: socket.socket, server_pid: int, server_pidfd: int,
                  priority: Priority, last_request: bytes) -> NoReturn:
    """A spare's life: wait for one request (sent by `Spares.hand`, checked by
    the server), then run it as a freshly forked child would; EOF: not needed, exit 0."""
    try:
        die_with_parent(server_pid, server_pidfd)
        detach()
        preset_priority(priority)
        rehearse(last_request)
        data, ancillary, _flags, _ = sock.recvmsg(RECV_MAX, socket.CMSG_SPACE(8))
        fds = fds_of(ancillary)
        if not data:
            os._exit(0)
        sock.close()
        message = json.loads(data)
        spec = ChildSpec(**message["spec"])
        title = str(message["title"])
        result_fd, output_fd = fds
    except BaseException:  # noqa: BLE001 — the server reports an exit without a report: a crash
        os._exit(71)
    run_child(spec, result_fd, server_pid, title, output_fd, server_pidfd, preset=priority)
    os._exit(71)  # not reached: run_child ends the process
