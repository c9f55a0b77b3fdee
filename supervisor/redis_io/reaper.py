"""Reaper: hand expired leases back (every supervisor runs it; safe concurrently).

The reclaim script moves each expired lease of a queue back to pending with a crash
counted, or to dead past `max_crashes`, at a cost of O(expired). It runs every
`reaper_interval` for every served queue, and in the very round trip that reports a
crashed child (`expire`), so a crash is back in pending within milliseconds.

Each timed pass also sweeps the jobs whose expiry before start passed while they
waited (sweep_expired.lua, at most `SWEEP_BATCH` per queue a pass): dead, never run,
and trims the records of ended jobs past their keep age or count (trim.lua, at most
`TRIM_BATCH` index entries per queue a pass; docs/operations/retention.md): a queue
with jobs that ended here since its last trim (or more left to trim) every pass, any
other every `TRIM_IDLE_EVERY`-th pass, so an idle fleet does not trim what is not there
(its records still age out, a few seconds late; the supervisor whose jobs end trims).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import redis

from forq import Queue
from forq.defaults import MAX_CRASHES
from forq.store.control import parse_trim, trim_call
from forq.store.plans import trip_reason
from forq.supervisor.leases.calls import LeaseCalls, leasing
from forq.supervisor.observe.metrics import Metrics
from forq.supervisor.redis_io.health import RedisHealth
from forq.supervisor.redis_io.relay import BatchRelay
from forq.supervisor.redis_io.shard_health import ShardHealth
from forq.supervisor.redis_io.shards import execute_by_shard

log = logging.getLogger("forq.supervisor")

TRIM_IDLE_EVERY = 10  # passes between the trims of a queue none of whose jobs end here


def describe_trip(raw: str) -> str:
    """A trip's reason (lua/includes/breaker.lua), for the log."""
    why = trip_reason(raw, 0, 0)
    return (f"{why.get('jobs', '?')} jobs ended {why.get('pattern', '?')} "
            f"({why.get('ends', '?')} of its {why.get('of', '?')} ends)")


class Reaper:
    def __init__(self, owner: str, queue_for: Callable[[str], Queue], metrics: Metrics,
                 on_reclaimed: Callable[[], None]) -> None:
        self.owner = owner
        self.queue_for = queue_for
        self.metrics = metrics
        self.on_reclaimed = on_reclaimed  # jobs went back to pending: claim
        self.max_crashes: dict[str, int] = {}  # each queue's default, for jobs without one
        self.tripped: dict[str, set[str]] = {}  # each queue's tripped tasks at the last pass
        self.passes = 0
        self.to_trim: set[str] = set()  # queues with ends here since their last trim

    def ended(self, names: Iterable[str]) -> None:
        """Jobs of these queues ended here (their reports answered): trim them next pass."""
        self.to_trim.update(names)

    def trims_due(self, names: list[str]) -> list[str]:
        """The queues this pass trims: every one on the first pass and each
        `TRIM_IDLE_EVERY`-th, else those with ends here since their last trim."""
        due = names if self.passes % TRIM_IDLE_EVERY == 1 else [
            name for name in names if name in self.to_trim]
        self.to_trim.difference_update(due)
        return due

    def send(self, pipe: Any, names: list[str]) -> None:
        for name in names:
            leasing(self.queue_for(name)).reclaim(self.owner, self.max_crashes.get(name, MAX_CRASHES),
                                         client=pipe)

    def send_sweeps(self, pipe: Any, names: list[str]) -> None:
        for name in names:
            leasing(self.queue_for(name)).sweep_expired(self.owner, client=pipe)

    def send_trims(self, pipe: Any, names: list[str]) -> None:
        for name in names:
            queue = self.queue_for(name)
            queue.scripts.run(trim_call(queue.keys), pipe)

    def trimmed(self, name: str, reply: Any) -> None:
        if isinstance(reply, Exception):
            self.to_trim.add(name)
            log.warning("retention trim of %s failed: %s", name, reply)
            return
        result = parse_trim(reply)
        if result.more:  # its budget ran out: the rest next pass
            self.to_trim.add(name)
        if result.succeeded or result.dead:
            log.debug("trimmed %d succeeded and %d dead record(s) in %s", result.succeeded,
                      result.dead, name)

    def swept(self, name: str, reply: Any) -> None:
        if isinstance(reply, Exception):
            return
        ids = LeaseCalls.parse_sweep(reply)
        if ids:
            log.info("%d job(s) in %s expired before start: dead, never run", len(ids), name)

    def reap(self, client: Any, names: list[str], health: RedisHealth, relay: BatchRelay,
             shards: ShardHealth | None = None) -> None:
        """The periodic pass, every served queue in one round trip: expired leases,
        expired pending jobs, retention's trim, and the ends of batch members the `relay` carries to
        batches on other queues. On a cluster (`shards`), one pipeline per shard, the
        shards backing off left out: one shard down does not stop the others' pass."""
        if shards is None and not health.ready():
            return
        if shards is not None:
            names = [name for name in names if shards.ready(name)]
            if not names:
                return
        self.passes += 1
        trims = self.trims_due(names)
        pipe = client.pipeline(transaction=False)
        self.send(pipe, names)
        self.send_sweeps(pipe, names)
        for name in names:  # the circuit breakers' cool-downs: two reads when none tripped
            leasing(self.queue_for(name)).resume_tasks(client=pipe)
        self.send_trims(pipe, trims)
        relay.send(pipe, names)
        try:
            sent = execute_by_shard(pipe, shards.failing() if shards is not None else ())
        except (redis.RedisError, OSError) as exc:
            self.to_trim.update(trims)
            health.failed("reclaim", exc)
            return
        replies = sent.replies
        if shards is not None:
            shards.failed(sent.failed, "reclaim")
            shards.worked(sent.answered - set(sent.failed))
        elif any(isinstance(reply, Exception) for reply in replies):
            self.to_trim.update(trims)
            health.failed("reclaim", next(r for r in replies if isinstance(r, Exception)))
            return
        n, t = len(names), len(trims)
        for name, reply in zip(names, replies[:n], strict=True):
            self.answered(name, reply, say=True)
        for name, reply in zip(names, replies[n:2 * n], strict=True):
            self.swept(name, reply)
        for name, reply in zip(names, replies[2 * n:3 * n], strict=True):
            self.resumed(name, reply)
        for name, reply in zip(trims, replies[3 * n:3 * n + t], strict=True):
            self.trimmed(name, reply)
        try:
            relay.deliver(client, names, replies[3 * n + t:])
        except (redis.RedisError, OSError) as exc:
            health.failed("relay", exc)

    def resumed(self, name: str, reply: Any) -> None:
        if isinstance(reply, Exception):
            return
        done = LeaseCalls.parse_resume_tasks(reply)
        for task in sorted(set(done.tripped) - self.tripped.get(name, set())):
            log.warning("task %s of %s tripped its circuit breaker: %s; its jobs are parked "
                        "until `forq resume %s --task %s` or its cool-down", task, name,
                        describe_trip(done.tripped[task]), name, task)
        self.tripped[name] = set(done.tripped)
        if done.untripped:
            log.warning("%d task(s) of %s resumed after their circuit breaker's cool-down",
                        done.untripped, name)
        if done.moved:
            self.on_reclaimed()  # jobs back in pending: claim

    def answered(self, name: str, reply: Any, say: bool = False) -> None:
        if isinstance(reply, Exception):
            return
        to_pending, to_dead, completed, ids = LeaseCalls.parse_reclaim(reply)
        if not ids:
            return
        self.metrics.reclaimed(name, len(ids))
        self.on_reclaimed()
        if say:
            log.info("reclaimed %d expired lease(s) in %s: %d to pending, %d dead, "
                     "%d already complete", len(ids), name, to_pending, to_dead, completed)
