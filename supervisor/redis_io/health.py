"""RedisHealth: whether the supervisor should talk to Redis now.

A supervisor must ride out a Redis outage without crash-looping and without hammering
a Redis that is coming back: after a failure it waits (0.1 s, doubling up to 5 s)
before the next claim, report or reaper pass. Lease extension does not wait for it —
a lease that cannot be extended is fenced by `LeaseKeeper`, whatever this says.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from forq.supervisor.loop.eventloop import EventLoop

log = logging.getLogger("forq.supervisor")

BACKOFF_MIN = 0.1
BACKOFF_MAX = 5.0
LOG_EVERY = 5.0  # seconds between two "redis … failed" warnings


def wait_until_reachable(client: redis.Redis, loop: EventLoop, *, stopped: Callable[[], bool],
                         on_first_miss: Callable[[], object],
                         ping: Callable[[], object] | None = None) -> None:
    """At start, ping until Redis answers (backing off), serving the loop meanwhile so
    signals, metrics and the watchdog keep working; give up once `stopped()`. `ping`:
    another check than `client.ping()` (a cluster: the node forq's format lives on)."""
    delay = BACKOFF_MIN
    missed = False
    last_log = -LOG_EVERY
    while not stopped():
        try:
            (ping or client.ping)()
            return
        except (redis.RedisError, OSError) as exc:
            if not missed:
                on_first_miss()
                missed = True
            now = time.monotonic()
            if now - last_log > LOG_EVERY:  # said once, then every LOG_EVERY
                log.warning("redis not reachable yet (%s); retrying in %.1fs", exc, delay)
                last_log = now
            # the whole delay, whatever else wakes the loop meanwhile (a watchdog ping, a
            # scrape, a timer): a wake-up is not a reason to ping again
            retry_at = now + delay
            loop.timers.schedule(delay, lambda: None)
            while not stopped() and (left := retry_at - time.monotonic()) > 0:
                loop.run_once(cap=left)
            delay = min(delay * 2, BACKOFF_MAX)


class RedisHealth:
    def __init__(self, on_error: Callable[[str], None] = lambda _op: None,
                 clock: Callable[[], float] = time.monotonic, label: str = "redis") -> None:
        self.on_error = on_error  # counts the failure (a metric), by operation
        self.clock = clock
        self.label = label  # "redis", or "redis shard host:port" (see ShardHealth)
        self.backoff = BACKOFF_MIN
        self.down_until = 0.0
        self.last_log = -LOG_EVERY

    def ready(self) -> bool:
        """Not backing off after a failure."""
        return self.clock() >= self.down_until

    def failed(self, op: str, exc: BaseException) -> None:
        self.on_error(op)
        now = self.clock()
        self.down_until = now + self.backoff
        if now - self.last_log > LOG_EVERY:
            log.warning("%s %s failed (%s); retrying with backoff", self.label, op, exc)
            self.last_log = now
        self.backoff = min(self.backoff * 2, BACKOFF_MAX)

    def worked(self) -> bool:
        """Redis answered: talk to it again at once. True if it had been failing."""
        recovered = self.backoff > BACKOFF_MIN
        if recovered:
            log.info("%s reachable again", self.label)
        self.backoff = BACKOFF_MIN
        self.down_until = 0.0
        return recovered
