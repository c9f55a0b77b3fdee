"""A deliberately broken supervisor, for the checker's self-test, and a stall dump.

    python -m chaos.broken run --config FILE

It is forq's own `Supervisor` with collaborators replaced through its seams
(`make_fencer`, `make_reporter`, the `loop` argument), never a monkeypatch:

* ``FORQ_CHAOS_BREAK=no-fencing``: no fencing at all. A child whose lease is lost or
  unproven keeps running (its fork server is given no fencing deadlines either), and
  its ack first takes the lease back whatever the token (the race fencing exists to
  prevent). The checker must catch the double runs, and the overlapping ones.
* ``FORQ_CHAOS_BREAK=leak``: a slow leak, for the soak's self-test: `LEAK_PER_SECOND`
  fds left open (``/dev/null``) and as many times `LEAK_BYTES` of written memory held,
  topped up at each acknowledgement it sends, up to `LEAK_CAP` of each (past that it
  stays a slow leak, not an fd exhaustion). The soak must call both series a leak.
* ``FORQ_CHAOS_DEBUG=stall``: the loop dumps the supervisor's stack when a turn takes
  a second longer than it may (a diagnostic, not a fault).
* ``FORQ_CHAOS_DEBUG=tracemalloc``: what a soak's growing RSS is made of. The
  supervisor traces its allocations, takes a first snapshot after a minute, and every
  minute after that writes the lines whose memory grew most since then to
  ``FORQ_CHAOS_TRACEMALLOC_LOG`` (default ``/tmp/forq-tracemalloc-<name>.log``). Slower,
  and bigger: a diagnostic, not a soak to judge.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterable
from typing import Any

from forq.supervisor.children.running import RunningChild
from forq.supervisor.config.load import load_config
from forq.supervisor.leases.fencing import Fencer
from forq.supervisor.loop.eventloop import EventLoop
from forq.supervisor.redis_io.reports import Pending, Reporter
from forq.supervisor.supervisor import Supervisor

_STEAL = """
redis.call('HSET', KEYS[1], 'state', 'active', 'token', ARGV[1])
redis.call('ZADD', KEYS[2], 0, ARGV[2])
return 1
"""


class NoFencer(Fencer):
    def lost(self, job_ids: Iterable[str]) -> None:
        pass

    def first_deadline(self, sent_at: float) -> float | None:
        return None

    def deadlines(self) -> list[tuple[RunningChild, float]]:
        return []

    def unproven(self) -> None:
        for job_id in self.leases.unproven():
            self.leases.remove(job_id)  # forgets the lease, keeps the child running


class StealingReporter(Reporter):
    def send(self, pipe: Any, item: Pending) -> None:
        if item.outcome.kind == "ack":
            q = self.queue_for(item.child.queue)
            pipe.eval(_STEAL, 2, q.keys.job(item.child.job_id), q.keys.active, item.token,
                      item.child.job_id)
        super().send(pipe, item)


LEAK_PER_SECOND = 0.75  # fds (and LEAK_BYTES each) a second: 45 and 11 MiB a minute
LEAK_BYTES = 256 << 10
LEAK_CAP = 500


class LeakingReporter(Reporter):
    """Leaks at a steady pace in time, topped up at each ack it sends: a leak that
    followed the ack rate would wander with the host's load (a loaded CI host slows
    the jobs, not the clock), and the soak's self-test would judge the load."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started = time.monotonic()
        self.leaked_fds: list[int] = []
        self.leaked_memory: list[bytes] = []

    def send(self, pipe: Any, item: Pending) -> None:
        if item.outcome.kind == "ack":
            due = min(LEAK_CAP, int((time.monotonic() - self.started) * LEAK_PER_SECOND))
            while len(self.leaked_fds) < due:
                self.leaked_fds.append(os.open(os.devnull, os.O_RDONLY))
                self.leaked_memory.append(b"\x01" * LEAK_BYTES)  # written: resident
        super().send(pipe, item)


def reporter_class(breaks: set[str]) -> type[Reporter]:
    """The reporter with every break asked for (each a subclass that calls on)."""
    bases = tuple(cls for flag, cls in (("leak", LeakingReporter),
                                        ("no-fencing", StealingReporter)) if flag in breaks)
    if len(bases) <= 1:
        return bases[0] if bases else Reporter
    return type("BrokenReporter", bases, {})


class BrokenSupervisor(Supervisor):
    def __init__(self, config: Any, breaks: set[str], loop: EventLoop | None = None) -> None:
        self.breaks = breaks  # read by the seams, which the constructor calls
        super().__init__(config, loop=loop)

    def make_fencer(self) -> Fencer:
        if "no-fencing" in self.breaks:
            return NoFencer(self.leases, self.children.by_job)
        return super().make_fencer()

    def make_reporter(self, min_replicas: int, wait_ms: int) -> Reporter:
        return reporter_class(self.breaks)(self._queue_for, self.leases, self.metrics,
                                           min_replicas, wait_ms,
                                           task_info=self.spawner.task_info)


class StallDumpingLoop(EventLoop):
    def __init__(self, out: Any) -> None:
        super().__init__()
        self.out = out

    def run_once(self, cap: float = 1.0) -> None:
        faulthandler.dump_traceback_later(cap + 1.0, repeat=True, file=self.out)
        try:
            super().run_once(cap)
        finally:
            faulthandler.cancel_dump_traceback_later()


def trace_allocations(path: str, every: float = 60.0, frames: int = 12) -> None:
    """Start tracing; a thread writes the biggest growth since the first snapshot (not
    counting its own: the snapshots, and the source lines read to print them)."""
    tracemalloc.start(frames)
    own = [tracemalloc.Filter(False, tracemalloc.__file__),
           tracemalloc.Filter(False, linecache.__file__), tracemalloc.Filter(False, __file__)]

    def report() -> None:
        time.sleep(every)
        first = tracemalloc.take_snapshot().filter_traces(own)
        while True:
            time.sleep(every)
            now = tracemalloc.take_snapshot().filter_traces(own)
            with open(path, "a") as out:
                out.write(f"--- {time.strftime('%H:%M:%S')} pid {os.getpid()}, traced "
                          f"{tracemalloc.get_traced_memory()[0] >> 10} KiB\n")
                for stat in now.compare_to(first, "traceback")[:12]:
                    out.write(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks\n")
                    out.writelines(f"      {line}\n" for line in stat.traceback.format()[-2 * frames:])

    threading.Thread(target=report, name="tracemalloc", daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "run" or argv[1] != "--config":
        print("usage: python -m chaos.broken run --config FILE", file=sys.stderr)
        return 2
    from forq.supervisor.loop import logs

    config = load_config(argv[2])
    logs.setup(config.log_format)
    loop = None
    if os.environ.get("FORQ_CHAOS_DEBUG") == "stall":
        loop = StallDumpingLoop(open(os.environ.get("FORQ_CHAOS_STALL_LOG",
                                                    "/tmp/forq-stall.log"), "a"))
    elif os.environ.get("FORQ_CHAOS_DEBUG") == "tracemalloc":
        trace_allocations(os.environ.get("FORQ_CHAOS_TRACEMALLOC_LOG",
                                         f"/tmp/forq-tracemalloc-{config.name}.log"))
    breaks = set(os.environ.get("FORQ_CHAOS_BREAK", "").split(",")) & {"no-fencing", "leak"}
    if breaks:
        return BrokenSupervisor(config, breaks, loop=loop).run()
    return Supervisor(config, loop=loop).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
