"""The operator: changes waiting jobs while the system is hurt (issue 29 items 5 and 6).

While the producer runs, about three times a second (seeded), it picks a told job of
kind "moved" (enqueued with a delay, some lifo, some grouped) and promotes it,
reschedules it (0.2-3 s from now) or changes its priority; every tenth turn it promotes
up to five scheduled "moved" jobs at once with a bulk action (`Queue.bulk`, the find
walk). Each change is an atomic script that refuses a job in a state it does not apply
to (it started meanwhile): refusals, and calls that failed because Redis was down, are
counted, not errors. Every moved job must still end succeeded (invariant 1 and 5), and
the checker replays the new history entries: promoted only from scheduled, rescheduled
only from pending or scheduled, a priority change only before the job runs, and never a
claim before the run-at a job last had (invariant 2).
"""

from __future__ import annotations

import random
import threading
from collections import Counter

import redis

from forq import JobNotFound, JobStateError, Queue

from .context import QUEUE, Context
from .producer import client


class Operator(threading.Thread):
    def __init__(self, ctx: Context) -> None:
        super().__init__(name="operator", daemon=True)
        self.ctx = ctx
        self.rng = random.Random(f"{ctx.settings.seed}-operator")
        self.counts: Counter[str] = Counter()

    def run(self) -> None:
        ctx = self.ctx
        queue = Queue(QUEUE, redis=client(ctx.redis.url))
        turn = 0
        while not ctx.stop.is_set() and not ctx.production_done.is_set():
            ctx.stop.wait(self.rng.uniform(0.15, 0.5))
            turn += 1
            with ctx.lock:
                moved = [jid for jid, t in ctx.told.items() if t.kind == "moved"]
            if not moved:
                continue
            op = "bulk" if turn % 10 == 0 else self.rng.choice(["promote", "reschedule",
                                                                  "priority"])
            jid = self.rng.choice(moved)
            try:
                if op == "bulk":
                    result = queue.bulk("promote", "scheduled", task="chaos.moved", limit=5)
                    self.counts["bulk promoted"] += result.done
                    self.counts["bulk skipped"] += result.skipped
                elif op == "promote":
                    queue.promote(jid)
                elif op == "reschedule":
                    queue.reschedule(jid, delay=round(self.rng.uniform(0.2, 3.0), 2))
                else:
                    queue.set_priority(jid, self.rng.randint(-5, 5))
                self.counts[op] += 1
            except (JobStateError, JobNotFound):
                self.counts[f"{op} refused"] += 1
            except (redis.RedisError, OSError):
                self.counts[f"{op} failed (redis)"] += 1
        ctx.operator = dict(self.counts)
        ctx.log(f"operator: {dict(self.counts)}")
