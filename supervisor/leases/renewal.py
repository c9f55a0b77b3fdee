"""LeaseRenewal: the timer that keeps this supervisor's leases alive.

Every ``lease_ttl/3`` it asks the `LeaseKeeper` to extend every lease in one round
trip (one per shard on a cluster), then hands the answers to the `Fencer`: a lease
Redis calls lost, or a job cancelled, has its child killed now (a held job, leased
ahead of a free slot, is dropped or given back instead: it has no child). A shard that did not
answer backs off on its own (`ShardHealth`); its leases run out of proof and only
their children are fenced. A Redis error is retried within a fraction of
the TTL rather than a whole period later, so a short blip never costs a running job
its lease.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import redis

from forq import Queue
from forq.supervisor.children.spawner import Spawner
from forq.supervisor.children.table import Children
from forq.supervisor.leases.fencing import Fencer
from forq.supervisor.leases.keeper import LeaseKeeper, Riders
from forq.supervisor.loop.timers import Timers
from forq.supervisor.observe.metrics import Metrics
from forq.supervisor.redis_io.health import RedisHealth
from forq.supervisor.redis_io.shard_health import ShardHealth


class LeaseRenewal:
    def __init__(self, leases: LeaseKeeper, client: redis.Redis, queues: Mapping[str, Queue],
                 fencer: Fencer, spawner: Spawner, health: RedisHealth, metrics: Metrics,
                 timers: Timers, on_worked: Callable[[], None],
                 riders: Riders | None = None, shards: ShardHealth | None = None,
                 held: Children | None = None) -> None:
        self.leases = leases
        self.held = held  # the children's held leases (a queue's prefetch)
        self.client = client
        self.queues = queues
        self.fencer = fencer
        self.spawner = spawner
        self.health = health
        self.metrics = metrics
        self.timers = timers
        self.on_worked = on_worked  # Redis answered (after an outage: resubscribe)
        self.riders = riders  # commands that ride along (running jobs' progress)
        self.retrying = False  # a quick retry of a failed extension is scheduled
        self.shards = shards  # a cluster's shards: each one's failures are its own

    def extend(self) -> None:
        if not len(self.leases):
            return
        result = self.leases.extend_each(self.client, self.queues, self.riders,
                                         self.shards.failing() if self.shards else ())
        for shard, exc in result.failed.items():
            (self.shards.of(shard) if self.shards else self.health).failed("extend", exc)
        if result.failed and not self.retrying:
            self.retrying = True
            self.timers.schedule(max(0.05, min(0.25, self.leases.ttl / 10)), self._retry)
        if result.answered:
            if self.shards:
                self.shards.worked(result.answered)
            self.on_worked()
        if result.confirmed:
            self.metrics.lease_extended(result.confirmed)
        self.fencer.lost(result.lost)
        self.fencer.cancelled(result.cancelled)
        if self.held is not None:  # jobs leased ahead of a slot: never started
            self.held.forget_held(result.lost)
            self.held.release_held(result.cancelled, "cancelled while held")
        if result.answered:
            self.spawner.fence(self.fencer.deadlines())

    def _retry(self) -> None:
        self.retrying = False
        self.extend()
