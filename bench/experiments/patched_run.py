"""`forq run` with proposed fixes applied as monkeypatches, to measure what each is worth.

    FORQ_PATCHES=noscriptexists,notimerleak python bench/experiments/patched_run.py \\
        run --config FILE

Patches (comma-separated in FORQ_PATCHES; noscriptexists and notimerleak measured fixes
that have since been made in the code, and change nothing there now):

* noscriptexists — no `SCRIPT EXISTS` round trip before each pipeline (redis-py's
  `Pipeline.load_scripts`); the scripts are loaded once at start instead (no NOSCRIPT
  recovery: a Redis restart under this patch stalls it).
* notimerleak — cancel a child's time-limit timer when it exits.
* quietlog — the supervisor's per-job INFO lines off ("ready" and start-up kept).
* forkserver — fork children from bench/experiments/forkserver.py (a lean fork server
  without redis) instead of from the supervisor.
* marks — put time marks (claim reply parsed, fork called, child steps) in the child's
  environment, for the `bench.stamp_env` handler: splits pick-up latency.
"""

from __future__ import annotations

import array
import fcntl
import logging
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path[0] = str(REPO)  # not bench/experiments: `supervisor` is the package

PATCHES = set(filter(None, os.environ.get("FORQ_PATCHES", "").split(",")))

import redis.client  # noqa: E402

import forq.queue as jobs_queue  # noqa: E402
import forq.supervisor.child as child_mod  # noqa: E402
import forq.supervisor.children as children_mod  # noqa: E402
import forq.supervisor.supervisor as sup_mod  # noqa: E402
from forq.supervisor.cli import main  # noqa: E402


def no_script_exists() -> None:
    from forq.scripts import TRANSITIONS, source

    redis.client.Pipeline.load_scripts = lambda self: None
    preload = sup_mod.Supervisor.preload

    def load_then_preload(self):
        for name in TRANSITIONS:  # what the real fix does on first use and on NOSCRIPT
            self.redis.script_load(source(name))
        preload(self)

    sup_mod.Supervisor.preload = load_then_preload


def no_timer_leak() -> None:
    start, on_exit = sup_mod.Supervisor._start, sup_mod.Supervisor._on_child_exit

    def _start(self, queue, lease, sent_at):
        schedule = self.loop.timers.schedule
        handles = []

        def recording(delay, callback):
            handle = schedule(delay, callback)
            handles.append(handle)
            return handle

        self.loop.timers.schedule = recording
        try:
            start(self, queue, lease, sent_at)
        finally:
            self.loop.timers.schedule = schedule
        child = self.children.get(lease.job.id)
        if child is not None and handles:
            child._bench_timers = handles

    def _on_child_exit(self, child):
        on_exit(self, child)
        for handle in getattr(child, "_bench_timers", ()):
            self.loop.timers.cancel(handle)

    sup_mod.Supervisor._start = _start
    sup_mod.Supervisor._on_child_exit = _on_child_exit


def quiet_log() -> None:
    run = sup_mod.Supervisor.run

    def quiet_run(self):
        logger = logging.getLogger("forq.supervisor")
        info = logger.info

        def only_lifecycle(msg, *args, **kwargs):
            if msg == "ready" or msg.startswith(("supervisor ", "%s: draining", "stopped")):
                info(msg, *args, **kwargs)

        logger.info = only_lifecycle
        return run(self)

    sup_mod.Supervisor.run = quiet_run


def fork_server() -> None:
    state: dict = {"exits": {}}
    preload = sup_mod.Supervisor.preload

    def start_server(self):
        preload(self)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        theirs.set_inheritable(True)
        state["proc"] = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("forkserver.py")),
             str(theirs.fileno()), ",".join(self.config.imports)],
            pass_fds=[theirs.fileno()])
        theirs.close()
        ours.set_inheritable(False)
        state["sock"] = ours

    def receive():
        msg, ancillary, _flags, _addr = state["sock"].recvmsg(65536, socket.CMSG_LEN(4))
        reply = pickle.loads(msg)
        if reply[0] == "exit":
            state["exits"][reply[1]] = (reply[2], reply[3])
            return None
        fds = array.array("i")
        fds.frombytes(ancillary[0][2][:4])
        return reply[1], fds[0]

    def spawn(lease, spec, *, title, timeout):
        read_fd, write_fd = os.pipe()
        state["sock"].sendmsg([pickle.dumps((spec, title))],
                              [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                array.array("i", [write_fd]))])
        os.close(write_fd)
        got = None
        while got is None:
            got = receive()
        pid, pidfd = got
        flags = fcntl.fcntl(read_fd, fcntl.F_GETFL)
        fcntl.fcntl(read_fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        os.set_inheritable(read_fd, False)
        now = time.monotonic()
        return children_mod.RunningChild(lease, spec, pid, pidfd, read_fd, now, now + timeout)

    class Usage:
        def __init__(self, maxrss: int) -> None:
            self.ru_maxrss = maxrss

    real_wait4 = os.wait4

    def wait4(pid, options):
        if "sock" not in state or pid <= 0:
            return real_wait4(pid, options)
        while pid not in state["exits"]:
            receive()
        status, maxrss = state["exits"].pop(pid)
        return pid, status, Usage(maxrss)

    sup_mod.Supervisor.preload = start_server
    children_mod.spawn = spawn
    sup_mod.ch.spawn = spawn
    os.wait4 = wait4


def marks() -> None:
    last: dict = {}
    parse_claim = jobs_queue.Queue.parse_claim
    spawn = sup_mod.ch.spawn

    def parse(self, reply):
        last["reply"] = time.time()
        return parse_claim(self, reply)

    def marked_spawn(lease, spec, **kwargs):
        spec.extra_env = dict(spec.extra_env, BENCH_REPLY_AT=repr(last.get("reply", 0)),
                              BENCH_FORK_AT=repr(time.time()))
        return spawn(lease, spec, **kwargs)

    isolate, limit, die = child_mod._isolate, child_mod._limit, child_mod._die_with_parent

    def marked_die(parent_pid):
        os.environ["BENCH_CHILD_RUN"] = repr(time.time())
        die(parent_pid)

    def marked_isolate(spec, fd):
        os.environ["BENCH_CHILD_START"] = repr(time.time())
        out = isolate(spec, fd)
        os.environ["BENCH_AFTER_ISOLATE"] = repr(time.time())
        return out

    def marked_limit(spec):
        os.environ["BENCH_BEFORE_LIMIT"] = repr(time.time())
        limit(spec)
        os.environ["BENCH_AFTER_LIMIT"] = repr(time.time())

    jobs_queue.Queue.parse_claim = parse
    sup_mod.ch.spawn = marked_spawn
    child_mod._isolate = marked_isolate
    child_mod._limit = marked_limit
    child_mod._die_with_parent = marked_die


APPLY = {"noscriptexists": no_script_exists, "notimerleak": no_timer_leak,
         "quietlog": quiet_log, "forkserver": fork_server, "marks": marks}

if __name__ == "__main__":
    unknown = PATCHES - set(APPLY)
    if unknown:
        sys.exit(f"unknown patch(es): {', '.join(sorted(unknown))}; known: {', '.join(APPLY)}")
    for name in ("forkserver", "noscriptexists", "notimerleak", "quietlog", "marks"):
        if name in PATCHES:
            APPLY[name]()
    sys.exit(main(sys.argv[1:]))
