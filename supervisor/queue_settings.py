"""What a supervisor's config says of its queues, written to Redis where every
supervisor and producer reads it: global rate and max_in_flight, per-group concurrency
and rate, `paused = true`, and the queue's name in the set of known queues.

Written at start and on reload, and only for what the TOML sets: a limit set at run
time with `forq limit` stays until a config sets it. A config pauses a queue but never
resumes one (`forq resume` does), so an operator's pause survives a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from forq import Queue
from forq.supervisor.config import QueueConfig

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
        if register:
            client.sadd("forq:queues", qc.name)
