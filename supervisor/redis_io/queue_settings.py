"""What a supervisor's config says of its queues, written to Redis where every
supervisor and producer reads it: global rate and max_in_flight, per-group concurrency
and rate, `paused = true`, events (on or off, how many kept), the on_dead task, and
the queue's name in the set of known queues.

Written at start and on reload, and only for what the TOML sets: a limit set at run
time with `forq limit` stays until a config sets it. A config pauses a queue but never
resumes one (`forq resume` does), so an operator's pause survives a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import redis

from forq import Queue
from forq.supervisor.config.load import QueueConfig
from forq.supervisor.redis_io.shard_health import ShardHealth

log = logging.getLogger("forq.supervisor")


def push_queue_settings(queues: Iterable[QueueConfig], queue_for: Callable[[str], Queue],
                        client: Any, register: bool = True) -> None:
    """Raises the Redis error; the caller backs off and tries again at the next start
    or reload. `register=False`: not the names in forq:queues (on a cluster another
    shard than the queue's: the caller adds them apart)."""
    for qc in queues:
        queue = queue_for(qc.name)
        if qc.paused and queue.pause():
            log.info("queue %s paused by the config (paused = true): "
                     "`forq resume %s` starts it", qc.name, qc.name)
        if qc.rate_limit is not None or qc.max_in_flight is not None:
            queue.set_limits(
                rate=qc.rate_limit if qc.rate_limit is not None else False,
                max_in_flight=qc.max_in_flight if qc.max_in_flight is not None else False)
        if qc.group_concurrency is not None or qc.group_rate_limit is not None:
            queue.set_limits(
                group_concurrency=(qc.group_concurrency
                                   if qc.group_concurrency is not None else False),
                group_rate=qc.group_rate_limit if qc.group_rate_limit is not None else False)
        if qc.events is not None or qc.events_keep is not None:
            queue.set_events(qc.events is not False, keep=qc.events_keep)
        if qc.on_dead is not None:
            queue.set_on_dead(qc.on_dead)
        if register:
            client.sadd("forq:queues", qc.name)


class ShardSettings:
    """On a Redis Cluster, each queue's settings written on its own shard, the names in
    forq:queues apart (another shard): a queue whose shard is down at start is not
    claimed from (`unsettled`, which the `Claimer` skips: its config may pause it)
    until they are written, retried when its shard may answer again."""

    def __init__(self, client: Any, queue_for: Callable[[str], Queue], shards: ShardHealth,
                 unsettled: set[str]) -> None:
        self.client = client
        self.queue_for = queue_for
        self.shards = shards
        self.unsettled = unsettled  # the Claimer's: the same set
        self.unregistered: set[str] = set()  # served queues not yet in forq:queues

    def push_each(self, queues: Iterable[QueueConfig]) -> None:
        queues = list(queues)
        self.unsettled.clear()
        self.unsettled.update(qc.name for qc in queues)
        self.unregistered = set(self.unsettled)
        self.settle(queues)

    def settle(self, queues: Iterable[QueueConfig]) -> None:
        for qc in queues:
            if qc.name not in self.unsettled or not self.shards.ready(qc.name):
                continue
            try:
                push_queue_settings([qc], self.queue_for, self.client, register=False)
            except (redis.RedisError, OSError) as exc:
                self.shards.of(self.shards.shard(qc.name)).failed("limits", exc)
            else:
                self.unsettled.discard(qc.name)
        self.register()

    def register(self) -> None:
        """Each heartbeat tries again until forq:queues' shard answers."""
        if not self.unregistered or not self.shards.whole.ready():
            return
        try:
            self.client.sadd("forq:queues", *sorted(self.unregistered))
        except (redis.RedisError, OSError) as exc:
            self.shards.whole.failed("limits", exc)
        else:
            self.unregistered.clear()
