"""MemoryBudget: admission by memory, `[supervisor] memory_budget`.

Slots alone let a supervisor start two 1 GiB jobs on a machine with 1.5 GiB free, and
the OOM killer then picks a victim. With a budget, a job starts only while the memory
limits of the running children plus its own fit the budget; one that does not fit yet
stays leased here, held (`HeldLeases`, extended like a running job's lease), and
starts when a child's end frees room. What a job counts is its `memory_limit` (its
policy: job, task, queue, `[defaults]`); a job without one (`memory_limit = 0`) counts
as the whole budget, so it runs alone: it may use any amount, and a budget that
ignored it would protect nothing.

No head-of-line blocking: a held job that does not fit does not stop the smaller jobs
behind it, which start wherever they fit. Fairness, so a big job is not starved by a
stream of small ones: once it has waited `memory_reserve_after` (10 s), its size is
reserved (the longest-waiting first): other jobs start only where they fit beside it,
so it starts at the latest when the children running then have ended. Its wait is
bounded by that delay plus the longest of those children's time limits. Why 10 s and
not 0: until then the small jobs keep the room (a big job that arrives while another
runs usually waits for that one, not for the smalls), so their throughput holds
(`bench.memory_budget`); a reservation empties the room of smaller jobs first.

A job whose limit is over the whole budget could never start here: it is snoozed
(not an attempt; its history says why) with a growing delay (`refusal_delay`), so
it neither ping-pongs between supervisors nor is lost: a supervisor with a larger
budget, or none, takes it (this one claims that queue's delayed jobs a little later
for a while, `step_aside`, so the other wins the race when it is due); past its
`max_snoozes` it ends dead, with the reason.
The heartbeat publishes the budget, what is in use and the jobs refused
(`record`), which `forq stats` and the dashboard show.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from forq.supervisor.children.outcomes import FailMode, Kind, Outcome
from forq.supervisor.observe.metrics_memory import MemorySnapshot

log = logging.getLogger("forq.supervisor")

# a job held for memory this long (seconds; `memory_reserve_after`) reserves its size:
# smaller jobs stop passing it (`python -m bench.memory_budget` measures the waits)
RESERVE_AFTER = 10.0
# a job over the whole budget waits REFUSAL_BASE * 2^snoozes before it is due again,
# at most REFUSAL_MAX: another supervisor may take it meanwhile
REFUSAL_BASE_MS, REFUSAL_MAX_MS = 1_000, 60_000
MAX_REFUSED_LISTED = 20  # in the heartbeat record: the latest refusals
# after a refusal, this supervisor claims the queue's delayed jobs this much (seconds)
# after they are due, for a while: a supervisor with room is idle and claims at once,
# so the refused job goes to it rather than back here (claims of pending jobs are not
# delayed; `step_aside`)
STEP_ASIDE, STEP_ASIDE_FOR = 0.25, 2 * REFUSAL_MAX_MS / 1000


@dataclass
class Waiter:
    queue: str
    cost: int
    since: float  # monotonic: when a free slot first found no room for it


def mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def refusal_delay(snoozes: int) -> int:
    """The delay (ms) before a job refused for its size is due again."""
    return min(REFUSAL_MAX_MS, REFUSAL_BASE_MS << min(snoozes, 16))


def refusal(snoozes: int, why: str) -> Outcome:
    """A job whose memory limit is over the whole budget: snoozed (no attempt), longer
    each time, so a supervisor with room takes it; never started here."""
    return Outcome(Kind.FAIL, "snoozed", mode=FailMode.SNOOZE, reason=why,
                   delay_ms=refusal_delay(snoozes), counted=False,
                   error={"type": "OverMemoryBudget", "reason": why, "message": why})


class MemoryBudget:
    def __init__(self, budget: int | None = None, reserve_after: float = RESERVE_AFTER) -> None:
        self.budget = budget  # bytes; None: no admission by memory
        self.reserve_after = reserve_after
        # job id -> its running child's memory_limit (kept with no budget too: a reload
        # may set one while they run); their sum, and how many have none (0), kept as
        # they change: `used` is asked for every held job at every child's end
        self.running: dict[str, int] = {}
        self.limited, self.unlimited = 0, 0
        self.waiting: dict[str, Waiter] = {}  # held jobs a free slot found no room for
        self.smallest: dict[str, int] = {}  # queue -> the smallest cost seen (claims)
        # the latest refused, by job id: (queue, task, limit, when (monotonic)), oldest first
        self.refused: dict[str, tuple[str, str, int, float]] = {}
        self.refused_total = 0
        self.unlimited_warned: set[str] = set()  # tasks told about once

    def configure(self, budget: int | None, reserve_after: float = RESERVE_AFTER) -> None:
        self.budget, self.reserve_after = budget, reserve_after

    @property
    def used(self) -> int:
        return self.limited + self.unlimited * (self.budget or 0)

    def cost(self, limit: int, task: str = "") -> int:
        """What a job with this `memory_limit` counts against the budget."""
        if self.budget is None or limit > 0:
            return limit
        if task not in self.unlimited_warned:
            self.unlimited_warned.add(task)
            log.warning("task %s: jobs without a memory_limit count as the whole "
                        "memory_budget (%s): each runs alone; give them a memory_limit",
                        task, mib(self.budget))
        return self.budget

    def over(self, cost: int) -> bool:
        """The job could never start here: its limit is over the whole budget."""
        return self.budget is not None and cost > self.budget

    def reserved(self, job_id: str, now: float) -> int:
        """The size reserved for the longest-waiting job past `reserve_after`, when it is
        not `job_id` and waited longer than `job_id` did (0: none)."""
        mine = self.waiting.get(job_id)
        for wid, w in self.waiting.items():  # insertion order: the longest-waiting first
            if now - w.since < self.reserve_after:
                return 0
            if wid == job_id or (mine is not None and mine.since <= w.since):
                return 0
            return w.cost
        return 0

    def admits(self, job_id: str, queue: str, cost: int, now: float) -> bool:
        """Whether the job may start now, a slot being free for it; when not, it is
        a waiter from now on (its wait counts from the first refusal)."""
        if self.budget is None:
            return True
        self.smallest[queue] = min(self.smallest.get(queue, cost), cost)
        if self.used + cost + self.reserved(job_id, now) <= self.budget:
            return True
        self.waiting.setdefault(job_id, Waiter(queue, cost, now))
        return False

    def started(self, job_id: str, limit: int) -> None:
        self.waiting.pop(job_id, None)
        self.ended(job_id)  # a job id runs once at a time here; never counted twice
        self.running[job_id] = limit
        self.limited += max(0, limit)
        self.unlimited += limit <= 0

    def ended(self, job_id: str) -> None:
        limit = self.running.pop(job_id, None)
        if limit is not None:
            self.limited -= max(0, limit)
            self.unlimited -= limit <= 0

    def forget(self, job_id: str) -> None:
        """A held job given back or lost: it waits no more."""
        self.waiting.pop(job_id, None)

    def waiters(self, queue: str) -> int:
        return sum(1 for w in self.waiting.values() if w.queue == queue)

    def snapshot(self, held: int, queues: Iterable[str]) -> MemorySnapshot:
        """Its figures now (`held`: the held jobs' costs), for the metrics endpoint."""
        return MemorySnapshot(self.budget, self.used, held,
                              {q: self.waiters(q) for q in queues}, self.refused_total)

    def claimable(self, queue: str, held_cost: int, now: float) -> int | None:
        """How many jobs of `queue` room allows claiming (None: no budget). `held_cost`:
        what the held jobs not waiting for memory will take when they start. Sizes are
        unknown before the claim: counted at the smallest seen on the queue; with room
        for none of that size, one job is claimed while none of the queue waits (the
        queue's jobs may be smaller now: a probe that holds one job at most)."""
        if self.budget is None:
            return None
        room = self.budget - self.used - held_cost - self.reserved("", now)
        if room <= 0:
            return 0
        fit = room // max(1, self.smallest.get(queue, 1))
        return fit if fit > 0 or self.waiters(queue) else 1

    def refuse(self, job_id: str, queue: str, task: str, cost: int, now: float) -> str:
        """A job over the whole budget: noted for the heartbeat; returns the reason."""
        self.refused_total += 1
        self.refused.pop(job_id, None)
        self.refused[job_id] = (queue, task, cost, now)
        while len(self.refused) > MAX_REFUSED_LISTED:
            del self.refused[next(iter(self.refused))]
        return (f"over the memory budget: its memory_limit {mib(cost)} is more than "
                f"this supervisor's memory_budget {mib(self.budget or 0)}")

    def step_aside(self, queue: str, now: float) -> float:
        """How much later than due to claim the queue's delayed jobs (STEP_ASIDE)."""
        recent = any(q == queue and now - at < STEP_ASIDE_FOR
                     for q, _task, _limit, at in self.refused.values())
        return STEP_ASIDE if recent else 0.0

    def record(self, now: float) -> dict[str, object]:
        """The heartbeat's part: budget, in use, waiting jobs and the latest refused."""
        if self.budget is None:
            return {"memory_budget": None}
        return {
            "memory_budget": self.budget, "memory_used": self.used,
            "memory_waiting": [[wid, w.queue, w.cost, round(now - w.since, 3)]
                               for wid, w in list(self.waiting.items())[:MAX_REFUSED_LISTED]],
            "memory_refused": [{"id": jid, "queue": queue, "task": task, "limit": limit,
                                "ago": round(now - at, 3)}
                               for jid, (queue, task, limit, at) in self.refused.items()],
            "memory_refused_total": self.refused_total,
        }
