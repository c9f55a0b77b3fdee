"""Claimer: lease jobs for this supervisor's free slots, and start them.

One claim per served queue with free slots, queued on the loop turn's pipeline (beside
the reports, so a finished job's slot is refilled in the same round trip). The claim
script answers with the leases and, when nothing more is due now, when to ask again:
a delayed job's due time, or the rate limit's next token (`Wakeups.claim_at`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from forq import Queue
from forq.supervisor.children.table import Children
from forq.supervisor.config.load import Config
from forq.supervisor.leases.calls import leasing
from forq.supervisor.leases.keeper import LeaseKeeper
from forq.supervisor.loop.wakeups import Wakeups
from forq.supervisor.redis_io.health import BACKOFF_MIN, RedisHealth
from forq.supervisor.redis_io.shard_health import ShardHealth
from forq.supervisor.redis_io.shards import ShardDown

# Jobs leased per claim, at most: their leases run from the claim, and the children are
# started one after another before the loop can extend anything, so a claim of 1,000
# (concurrency 1000) let the last leases expire before their children were running.
CLAIM_BATCH = 32


class Claimer:
    def __init__(self, owner: str, queue_for: Callable[[str], Queue], children: Children,
                 leases: LeaseKeeper, wakeups: Wakeups, health: RedisHealth,
                 shards: ShardHealth | None = None,
                 code: Callable[[], str] = lambda: "") -> None:
        self.owner = owner
        self.queue_for = queue_for
        self.children = children
        self.leases = leases
        self.wakeups = wakeups
        self.health = health
        self.shards = shards  # a queue whose shard is backing off is not asked
        self.policies: dict[str, str] = {}  # each queue's job policy, JSON for the script
        self.unsettled: set[str] = set()  # config settings not yet written: not claimed
        # the handler code the jobs leased now will run, kept in their records
        self.code = code

    def send(self, pipe: Any, config: Config) -> list[str]:
        """A claim on `pipe` for each served queue with free slots; returns their names."""
        asks = []
        for qc in config.queues:
            free = min(self.children.free(qc.name), CLAIM_BATCH)
            if qc.name in self.unsettled:
                self.wakeups.claim_at(qc.name, self.shards.wait(qc.name) if self.shards
                                      else BACKOFF_MIN)  # try to write them again then
            elif free > 0 and self.shards is not None and not self.shards.ready(qc.name):
                self.wakeups.claim_at(qc.name, self.shards.wait(qc.name))  # once it may be back
            elif free > 0:
                leasing(self.queue_for(qc.name)).claim(self.owner, free, self.leases.ttl_ms,
                                                       self.policies[qc.name], client=pipe,
                                                       code=self.code())
                asks.append(qc.name)
        return asks

    def answered(self, name: str, reply: Any, sent_at: float) -> bool:
        """Start the leased jobs; arm a wake-up for what is not due yet. True when the
        claim came back full (CLAIM_BATCH): claim again at once."""
        if isinstance(reply, ShardDown):  # its shard backs off (ShardHealth); ask later
            self.wakeups.claim_at(name, self.shards.wait(name) if self.shards else BACKOFF_MIN)
            return False
        if isinstance(reply, Exception):
            self.health.failed("claim", reply)
            return False
        result = leasing(self.queue_for(name)).parse_claim(reply)
        self.children.start_all(name, result.leases, sent_at)
        if result.next_due_ms >= 0:
            # a job refused here for its size may be the one due: let a peer with room
            # claim it first (`MemoryBudget.step_aside`)
            later = self.children.budget.step_aside(name, time.monotonic())
            self.wakeups.claim_at(name, (result.next_due_ms - result.now_ms) / 1000 + later)
        if result.rate_wait_ms > 0:
            self.wakeups.claim_at(name, result.rate_wait_ms / 1000)
        return len(result.leases) == CLAIM_BATCH
