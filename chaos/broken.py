"""A deliberately broken supervisor, for the checker's self-test, and a stall dump.

    python -m chaos.broken run --config FILE

It is forq's own `Supervisor` with collaborators replaced through its seams
(`make_fencer`, `make_reporter`, the `loop` argument), never a monkeypatch:

* ``FORQ_CHAOS_BREAK=no-fencing``: no fencing at all. A child whose lease is lost or
  unproven keeps running (its fork server is given no fencing deadlines either), and
  its ack first takes the lease back whatever the token (the race fencing exists to
  prevent). The checker must catch the double runs, and the overlapping ones.
* ``FORQ_CHAOS_DEBUG=stall``: the loop dumps the supervisor's stack when a turn takes
  a second longer than it may (a diagnostic, not a fault).
"""

from __future__ import annotations

import faulthandler
import os
import sys
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


class BrokenSupervisor(Supervisor):
    def make_fencer(self) -> Fencer:
        return NoFencer(self.leases, self.children.by_job)

    def make_reporter(self, min_replicas: int, wait_ms: int) -> Reporter:
        return StealingReporter(self._queue_for, self.leases, self.metrics, min_replicas,
                                wait_ms, task_info=self.spawner.task_info)


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
    broken = "no-fencing" in os.environ.get("FORQ_CHAOS_BREAK", "").split(",")
    cls = BrokenSupervisor if broken else Supervisor
    return cls(config, loop=loop).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
