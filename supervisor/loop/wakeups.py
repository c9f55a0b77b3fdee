"""Wakeups: when to claim, without busy polling.

Three sources, cheapest first: a pub/sub message on a queue's wake channel (the
enqueue, ack and release scripts publish when work becomes due now, or the due time
of a delayed job), a per-queue timer (a delayed job's due time, the rate limit's next
token) and, as a safety net for a message lost while reconnecting, a poll every
`POLL_INTERVAL`. Each ends in `on_wake()`: the supervisor claims on its next turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from forq.store.keys import QueueKeys
from forq.supervisor.loop.eventloop import EventLoop
from forq.supervisor.redis_io.health import RedisHealth

log = logging.getLogger("forq.supervisor")

POLL_INTERVAL = 2.0


class Wakeups:
    def __init__(self, loop: EventLoop, client: redis.Redis, health: RedisHealth,
                 on_wake: Callable[[], None], pick_node: Callable[[], Any] | None = None
                 ) -> None:
        self.loop = loop
        self.client = client
        self.health = health
        self.on_wake = on_wake
        self.pubsub: Any = None
        self.sock: Any = None  # the socket registered in the selector
        self.queues: list[str] = []
        self.timers: dict[str, tuple[list, float]] = {}  # queue -> (timer, monotonic due)
        # on a cluster: the node to listen on (PUBLISH reaches every node, so any will
        # do: one whose shard is not failing); None lets redis-py choose
        self.pick_node = pick_node
        self.node_name: str | None = None  # the cluster node listened on

    @property
    def subscribed(self) -> bool:
        return self.pubsub is not None

    def subscribe(self, queues: Iterable[str]) -> None:
        """Listen on these queues' wake channels (again, after an error or a reload)."""
        self.unsubscribe()
        self.queues = list(queues)
        try:
            node = self.pick_node() if self.pick_node is not None else None
            where = {"node": node} if node is not None else {}
            self.node_name = node.name if node is not None else None
            self.pubsub = self.client.pubsub(ignore_subscribe_messages=True, **where)
            self.pubsub.subscribe(*(QueueKeys(q).wake for q in self.queues))
            self.sock = self.pubsub.connection._sock
            self.loop.add_reader(self.sock, self._on_readable)
        except (redis.RedisError, OSError, AttributeError) as exc:
            self.health.failed("subscribe", exc)
            self.pubsub = None

    def resubscribe(self) -> None:
        """After an outage the wake connection is gone: back at once."""
        if self.pubsub is None and self.queues:
            self.subscribe(self.queues)

    def shard_down(self, shard: str) -> None:
        """A cluster shard stopped answering: if it is the node listened on, listen on
        another (a stopped node says nothing, not even an error)."""
        if shard == self.node_name and self.queues:
            log.info("wake-ups: listening on another node than %s", shard)
            self.subscribe(self.queues)

    def unsubscribe(self) -> None:
        # unregister the socket we registered, even if redis-py has already closed and
        # dropped it after an error: a stale selector entry would refuse the next
        # registration of its (reused) fd number — a child's pidfd, or the next pubsub
        if self.sock is not None:
            self.loop.remove_reader(self.sock)
            self.sock = None
        if self.pubsub is None:
            return
        try:
            self.pubsub.close()
        except (redis.RedisError, OSError):
            pass
        self.pubsub = None

    def stop(self) -> None:
        """Draining: no more wake-ups (claim timers die with the loop)."""
        self.queues = []
        self.unsubscribe()

    def _on_readable(self, _sock: Any, _mask: int) -> None:
        try:
            while True:
                message = self.pubsub.get_message(timeout=0.0)
                if message is None:
                    break
                if message.get("type") == "message":
                    self.on_message(message["channel"], message["data"])
        except (redis.RedisError, OSError, AttributeError) as exc:
            self.health.failed("subscribe", exc)
            self.unsubscribe()

    def on_message(self, channel: str, data: str) -> None:
        """A wake message: "0" means work is due now, else the Unix ms it will be."""
        queue = channel[channel.index("{") + 1:channel.index("}")]
        try:
            due = int(float(data))
        except ValueError:
            due = 0
        if due == 0:
            self.on_wake()
        else:
            self.claim_at(queue, due / 1000 - time.time())

    def claim_at(self, queue: str, delay: float) -> None:
        """Claim again after `delay` seconds (a delayed job or the rate limit's next
        token); one timer per queue, the earliest wins."""
        delay = max(0.001, min(delay, POLL_INTERVAL))
        due = time.monotonic() + delay
        current = self.timers.get(queue)
        if current is not None and current[1] <= due:
            return
        if current is not None:
            self.loop.timers.cancel(current[0])
        handle = self.loop.timers.schedule(delay, lambda: self._timer_fired(queue))
        self.timers[queue] = (handle, due)

    def _timer_fired(self, queue: str) -> None:
        self.timers.pop(queue, None)
        self.on_wake()

    def poll(self) -> None:
        """The safety net: claim anyway, and subscribe again if the subscription died."""
        self.on_wake()
        self.resubscribe()
