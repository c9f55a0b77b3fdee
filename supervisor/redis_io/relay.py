"""BatchRelay: carry the ends of batch members to batches that live on other queues.

A transition in one queue's slot cannot write another's (Redis Cluster), so a member
whose batch lives on another queue leaves its end in its own queue's relay zset. Every
supervisor's reaper pass reads the relays of the queues it serves, delivers each end to
its batch (`batch_relay.lua`, in the batch's slot: an end delivered twice counts once),
then removes what was delivered: a supervisor that dies in between leaves the entries
for the next pass, which delivers them again harmlessly.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from forq import Queue
from forq.store import transitions as tr

log = logging.getLogger("forq.supervisor")

RELAY_BATCH = 500  # entries read per queue per pass


class BatchRelay:
    def __init__(self, queue_for: Callable[[str], Queue]) -> None:
        self.queue_for = queue_for

    def send(self, pipe: Any, names: list[str]) -> None:
        """Queue the read of each served queue's relay (its replies: `deliver`)."""
        for name in names:
            pipe.zrange(self.queue_for(name).keys.relay, 0, RELAY_BATCH - 1)

    def deliver(self, redis: Any, names: list[str], replies: list[Any]) -> int:
        """Deliver what `send` read (two round trips, only when there is something).
        Returns how many entries were delivered and removed."""
        by_batch_queue: dict[str, list[tuple[str, str, bool]]] = {}
        sources: dict[str, list[str]] = {}
        for name, entries in zip(names, replies, strict=True):
            if isinstance(entries, Exception) or not entries:
                continue
            for raw in entries:
                try:
                    batch_queue, batch_id, member, ok = json.loads(raw)
                except (ValueError, TypeError):  # written by our scripts: never, but never fatal
                    log.error("queue %s: unreadable batch relay entry %r; dropped", name, raw[:200])
                    sources.setdefault(name, []).append(raw)
                    continue
                by_batch_queue.setdefault(str(batch_queue), []).append(
                    (str(batch_id), str(member), ok == 1))
                sources.setdefault(name, []).append(raw)
        if not sources:
            return 0
        if by_batch_queue:
            pipe = redis.pipeline(transaction=False)
            for batch_queue, ends in sorted(by_batch_queue.items()):
                q = self.queue_for(batch_queue)
                q.scripts.run(tr.batch_relay_call(q.keys, ends), pipe)
            pipe.execute()  # raises: nothing is removed, the next pass delivers again
        pipe = redis.pipeline(transaction=False)
        for name, raws in sorted(sources.items()):
            pipe.zrem(self.queue_for(name).keys.relay, *raws)
        pipe.execute()
        return sum(len(raws) for raws in sources.values())
