"""The fork server: a lean process that forks job children for the supervisor.

    python -m forq.supervisor.fork.server FD      (settings in $FORQ_FORKSERVER, JSON)

Started by the supervisor at start-up, exec'd fresh so it does not share the
supervisor's 37 MiB heap (redis, metrics, the event loop) and holds nothing of it: no
Redis connection, no config, no password (its environment is scrubbed before the exec,
`environment.py`). It is the only process that imports the handler modules — their
top-level code is handler code — and it drops to `[sandbox].run_as` *before* importing
them. It then tells the supervisor which tasks exist (`tasks.py`) and which code it
imported (`fingerprint.py`), freezes its heap, and forks each job's child. A fork from
it is cheaper for both sides, and the supervisor, which no longer forks, takes no
copy-on-write faults from its children.

FD is its end of a SOCK_SEQPACKET socketpair; `protocol` describes the messages.

Spare children: it keeps up to `spares` (its settings) idle children forked in
advance, each blocked reading a socketpair of its own, so the fork — a few
milliseconds of copying page tables, more than anything else between a claim and the
handler's first line — happens before the job arrives rather than while the supervisor
waits for the pid. A request that fits in one datagram and wants no namespaces is
handed to a spare: the same request bytes and its two fds go down the spare's socket,
and the spare runs `run_child` exactly as a freshly forked child would (a namespaced
child is forked for its job: how it is forked depends on the job). Spares are forked
again only once no job has run for a few milliseconds (under load they cost more than
they save: `Server.refill`), and when no request is waiting, so refilling never delays
a job. An idle spare holds nothing of any job (its own socket and stdio: the server's
socket, wake-up pipe and the other spares' sockets are closed in it), is titled
`SPARE_TITLE`, and the supervisor never hears of it until it runs a job: one that dies
idle is reaped without an exit report, one that reads EOF (the server retires,
`{"retire": true}`) exits 0.

It dies with the supervisor (PR_SET_PDEATHSIG), and a child dies with it, spares
included; EOF on its socket (the supervisor closed it or died) ends it too. Every process
a job starts ends with the job and with the fork server, escapees included: it is a
child subreaper, kills what a job's tree leaves it, and when its supervisor dies ends
them all before it goes (`orphans`).
"""

from __future__ import annotations

import array
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
from typing import Any, NoReturn

from forq import registry
from forq.supervisor.fork import (
    fingerprint,
    hugepages,
    leanfork,
    namespaces,
    orphans,
    sandbox,
    tasks,
)
from forq.supervisor.fork.child import (
    DEFAULT_PRIORITY,
    PR_SET_PDEATHSIG,
    PRCTL,
    ChildSpec,
    Priority,
    detach,
    die_with_parent,
    preset_priority,
    priority_of,
    run_child,
    scrub_service_vars,
)
from forq.supervisor.fork.environment import restore
from forq.supervisor.fork.protocol import RECV_MAX, fds_of, read_memfd, send

SERVER_TITLE = "forq: fork server"
# an idle child's, set around its fork so it never shows the server's: tools that count
# the fork server's children as jobs (`forq.testing.supervisor`) can leave spares out
SPARE_TITLE = "forq: fork server: spare"
# no spare is forked until this long after the last job ended or was asked for: under
# load the next request comes sooner (a slot's claim, 1–2 ms), and on an idle
# supervisor 5 ms is well before a job is likely to come
QUIET_BEFORE_SPARES = 0.005


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
        self.spares = spares  # idle children to keep forked in advance
        self.idle: dict[int, socket.socket] = {}  # spare pid -> our end of its socket
        # the priority (nice, oom_score_adj) the spares preset: the last request's,
        # ChildSpec's defaults before any
        self.priority: Priority = DEFAULT_PRIORITY
        self.last_request = b""  # the last job's request, as it came (`rehearse`)
        self.dismissed: set[int] = set()  # spares told to go (EOF), not reaped yet
        self.retiring = False  # the supervisor forks no more here: no more spares
        self.set_title = set_title
        # monotonic time of the last request or reaped job (`refill` waits for quiet)
        self.busy_at = float("-inf")
        self.huge_pages = huge_pages  # what the heap is on (`hugepages.report`)
        # children of ours we did not fork for a job: what handler modules' top-level
        # code started (at `serve`), left alone; any other is a stray (`kill_strays`)
        self.own: set[int] = set()
        self.strays_at = 0.0  # monotonic time of the next look for strays while jobs run

    def serve(self, namespaces_problem: str | None = None,
              hidden: list[str] | None = None) -> None:
        table = tasks.describe(registry.registered())
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
            timeout = _earliest(self.refill(), self.fence_timeout(), self.strays_timeout())
            try:
                watched: list[Any] = [self.sock, self.wake_r]
                ready, _, _ = select.select(watched, [], [], timeout)
            except InterruptedError:
                continue
            self.fence()
            if self.children and time.monotonic() >= self.strays_at:
                self.kill_strays()
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
        kills us next), end quietly, and every job's processes with us."""
        try:
            send(self.sock, message, fds)
        except OSError:
            orphans.end_every_child()

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
            try:
                os.killpg(pid, signal.SIGKILL)  # no grandchild outlives its job
            except (ProcessLookupError, PermissionError):
                pass
            self.kill_strays()  # its orphans, re-parented to us as it exited
            _, status, usage = os.wait4(pid, 0)
            self.busy_at = time.monotonic()
            self.children.discard(pid)
            self.fence_at.pop(pid, None)
            # its CPU time counts every process of its tree it reaped (a subreaper's)
            exit_message = {"exit": pid, "status": status, "maxrss": usage.ru_maxrss,
                            "utime_us": int(usage.ru_utime * 1e6),
                            "stime_us": int(usage.ru_stime * 1e6)}
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
        from before `serve`: a process a job left behind (`orphans`). It is reaped, as
        it ends, by `reap`."""
        self.strays_at = time.monotonic() + orphans.STRAY_SCAN
        try:
            children = orphans.own_children()
        except OSError as exc:  # never "none": say so, and look again on the next turn
            print(f"fork server: cannot list its children to end what jobs left: {exc}",
                  flush=True)
            return
        for pid in children:
            if (pid in self.children or pid in self.idle or pid in self.dismissed
                    or pid in self.own):
                continue
            try:
                os.kill(pid, signal.SIGKILL)  # our child until we reap it: not another's
            except ProcessLookupError:
                pass

    def forget(self, pid: int) -> bool:
        """Reap a child that ran no job: a spare that ended before it was given one
        (killed, or dismissed), or a stray (True)."""
        os.waitpid(pid, 0)
        self.own.discard(pid)
        sock = self.idle.pop(pid, None)
        if sock is not None:
            sock.close()
            return False
        if pid in self.dismissed:
            self.dismissed.discard(pid)
            return False
        return True

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
                self.retire()
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
            self.last_request = data
        try:
            # a namespaced child's fork depends on its job: it cannot be made in advance
            pid = self.hand_to_spare(data, [result_fd, output_fd]) \
                if inline and not spec.namespaces and self.spare_fits(spec) else None
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
        """In a child just forked: close what is the server's — its socket to the
        supervisor, its wake-up pipe (no signal of ours may write to that fd number once
        it is reused) and every spare's socket."""
        signal.set_wakeup_fd(-1)
        self.sock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)
        for sock in self.idle.values():
            sock.close()

    # -- spares --------------------------------------------------------------------

    def spare_fits(self, spec: ChildSpec) -> bool:
        """Whether the spares' preset priority is this job's. If not, the spares go, and
        those forked next preset this one's: a niced process cannot be un-niced, nor
        its oom_score_adj lowered, without privileges a fork server may not have."""
        if priority_of(spec) == self.priority:
            return True
        self.priority = priority_of(spec)
        self.dismiss_spares()
        return False

    def hand_to_spare(self, request: bytes, fds: list[int]) -> int | None:
        """Give the request (already checked here) and its fds to an idle child; its
        pid, or None if there is no spare left to take it (one that died cannot)."""
        while self.idle:
            pid = next(iter(self.idle))
            sock = self.idle.pop(pid)
            try:
                sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                          array.array("i", fds))])
            except OSError:  # it died idle: `reap` collects it, without a report
                self.dismissed.add(pid)
                continue
            finally:
                sock.close()
            return pid
        return None

    def refill(self) -> float | None:
        """Fork spares up to `spares`, but only once no job has run or been asked for
        for `QUIET_BEFORE_SPARES`, and while no request waits (a request is never
        delayed by a fork made for the next one). Returns how long until a refill may
        be due, None if none is.

        A spare is for the idle case, where a job's start waited for its fork. Under
        load it costs: while a spare lives, every page we write is copied for it
        (measured: 0.7 ms of children's CPU a job, 10% of the no-op throughput, at
        concurrency 2, when spares were kept while jobs ran), and a job handed to one
        pays a second decoding and the rehearsals. It saves no time there either: a
        slot's next job is claimed only when the last one ended, and on a busy machine
        the CPU a spare's set-up takes "in advance" is taken from the running jobs."""
        if len(self.idle) >= self.spares or self.retiring or self.children:
            return None
        quiet_for = time.monotonic() - self.busy_at
        if quiet_for < QUIET_BEFORE_SPARES:
            return QUIET_BEFORE_SPARES - quiet_for
        while len(self.idle) < self.spares:
            waiting, _, _ = select.select([self.sock], [], [], 0)
            if waiting or not self.fork_spare():
                return None
            rehearse(self.last_request)
        return None

    def fork_spare(self) -> bool:
        """Fork one idle child (False if the fork failed: try again on the next turn)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.title(SPARE_TITLE)  # it is a spare from its first instruction on
        try:
            pid = leanfork.fork()
        except OSError:
            pid = -1
        if pid == 0:
            ours.close()
            self.close_in_child()
            _wait_for_job(theirs, self.me, self.pidfd, self.priority, self.last_request)
        self.title(SERVER_TITLE)
        theirs.close()
        if pid < 0:
            ours.close()
            return False
        self.idle[pid] = ours
        return True

    def retire(self) -> None:
        """The supervisor forks no more here (a reload replaced us): the spares go now,
        the running children when they end."""
        self.retiring = True
        self.dismiss_spares()

    def dismiss_spares(self) -> None:
        for pid, sock in self.idle.items():
            sock.close()  # EOF: it exits 0, and `reap` collects it
            self.dismissed.add(pid)
        self.idle.clear()

    def title(self, text: str) -> None:
        if self.set_title is not None:
            try:
                self.set_title(text)
            except Exception:  # noqa: BLE001 — a title is cosmetic
                pass


def _earliest(*timeouts: float | None) -> float | None:
    """The shortest of these select timeouts (None: no limit)."""
    given = [t for t in timeouts if t is not None]
    return min(given) if given else None


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


def _wait_for_job(sock: socket.socket, server_pid: int, server_pidfd: int,
                  priority: Priority, last_request: bytes) -> NoReturn:
    """A spare's life: wait for one request (sent by `Server.hand_to_spare`, checked by
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



def _end_with(supervisor_pid: int) -> None:
    """From now on, when the supervisor dies, end every job's processes, then exit
    (`orphans`), rather than die at once by SIGKILL and leave their orphans to init. As
    PID 1 of a PID namespace of our own (`namespaces.become_init`), SIGKILL it stays:
    our end is the end of every process in that namespace."""
    if PRCTL is None or os.getpid() == 1:
        return
    signal.signal(orphans.DEATH_SIGNAL, lambda *_: orphans.end_every_child())
    PRCTL(PR_SET_PDEATHSIG, orphans.DEATH_SIGNAL, 0, 0, 0)
    if os.getppid() != supervisor_pid:  # it died before we asked
        orphans.end_every_child()


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
    hidden: list[str] = []
    if probe and os.geteuid() != 0:
        try:  # unprivileged: the privilege to make a PID namespace per job, in our own
            hidden = namespaces.become_init(sock.fileno(), tuple(settings.get("hide", ())))
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
    _end_with(supervisor_pid)
    huge_pages = settings.get("huge_pages") is not False
    # last, on the heap as the handler modules left it: every fork copies its page table
    pages = hugepages.report(huge_pages, hugepages.collapse() if huge_pages else "")
    spares = settings.get("spares", 0)
    Server(sock, supervisor_pid, spares if isinstance(spares, int) else 0,
           set_title, init_forks, code, pages).serve(problem, hidden)


if __name__ == "__main__":
    main(sys.argv[1:])
