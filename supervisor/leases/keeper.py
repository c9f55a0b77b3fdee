"""LeaseKeeper: keep every lease this supervisor holds alive, and know which it can
no longer prove it holds.

One batched ``extend`` per queue, all queues in one pipeline, every ``lease_ttl/3``
(on a Redis Cluster one pipeline per shard: a shard that is down leaves only its own
leases unproven, and only their children are fenced).
A lease is *proven* until the moment the last confirmed extension was sent plus the
TTL (Redis computed its deadline later than that, so the local figure is never late).
A child whose lease is unproven (Redis unreachable too long, or the supervisor was
stopped) must be killed before another supervisor can reclaim and rerun the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from forq import Queue
from forq.supervisor.leases.calls import LeaseCalls, leasing
from forq.supervisor.redis_io.shards import PLAIN, execute_by_shard, shard_of

# queues commands on the extension's pipeline; returns what takes their replies (None:
# the round trip failed)
Riders = Callable[[Any], Callable[[list[Any] | None], None]]


@dataclass
class Extension:
    """What one extension round learnt."""

    lost: list[str] = field(default_factory=list)  # ids Redis answered lost
    cancelled: list[str] = field(default_factory=list)
    confirmed: int = 0  # leases proven anew
    failed: dict[str, BaseException] = field(default_factory=dict)  # shard -> error
    answered: set[str] = field(default_factory=set)  # shards that confirmed


class LeaseKeeper:
    def __init__(self, lease_ttl: float, safety: float = 0.1) -> None:
        self.ttl = lease_ttl
        self.ttl_ms = int(lease_ttl * 1000)
        # fence a little before the Redis deadline, so the child is gone by the time
        # any reaper could see the lease as expired
        self.margin = max(0.01, lease_ttl * safety)
        self._held: dict[str, tuple[str, str]] = {}  # job id -> (queue, token)
        self._proven: dict[str, float] = {}  # job id -> monotonic time proven until

    def __len__(self) -> int:
        return len(self._held)

    def add(self, queue: str, job_id: str, token: str, sent_at: float) -> None:
        self._held[job_id] = (queue, token)
        self._proven[job_id] = sent_at + self.ttl

    def remove(self, job_id: str) -> None:
        self._held.pop(job_id, None)
        self._proven.pop(job_id, None)

    def token(self, job_id: str) -> str | None:
        held = self._held.get(job_id)
        return held[1] if held else None

    def proven_until(self, job_id: str) -> float | None:
        """Monotonic time until which this job's lease is proven held, if it is held."""
        return self._proven.get(job_id)

    def extend(self, client, queues: Mapping[str, Queue],
               riders: Riders | None = None
               ) -> tuple[list[str], list[str]]:
        """Extend every lease in one round trip. Returns (lost ids, cancelled ids).
        Raises the Redis error when a shard (or the one Redis) could not be reached:
        what the others confirmed is proven all the same."""
        result = self.extend_each(client, queues, riders)
        if result.failed:
            raise next(iter(result.failed.values()))
        return result.lost, result.cancelled

    def extend_each(self, client, queues: Mapping[str, Queue], riders: Riders | None = None,
                    failing: Collection[str] = ()) -> Extension:
        """Extend every lease, one `extend` call per queue: on a plain Redis in one
        pipeline, on a cluster one pipeline per shard (the shards in `failing` last), so
        a shard that cannot be reached leaves only its own leases unproven. Never raises
        for Redis errors: they are in `Extension.failed`, by shard.
        `riders(pipe)` may queue commands that ride along (running jobs' progress) and
        returns what takes their replies (None if the round trip failed); a rider's
        error never fails the extension."""
        by_queue: dict[str, list[tuple[str, str]]] = {}
        for job_id, (queue, token) in self._held.items():
            by_queue.setdefault(queue, []).append((job_id, token))
        result = Extension()
        if not by_queue:
            return result
        sent_at = time.monotonic()
        pipe = client.pipeline(transaction=False)
        take = riders(pipe) if riders is not None else None
        first = len(pipe.command_stack)
        names = list(by_queue)
        for name in names:
            leasing(queues[name]).extend(by_queue[name], self.ttl_ms, client=pipe)
        try:
            sent = execute_by_shard(pipe, failing)
        except (redis.RedisError, OSError) as exc:  # a plain Redis: nothing proven
            if take is not None:
                take(None)
            result.failed[PLAIN] = exc
            return result
        replies = sent.replies
        if take is not None:
            take(replies[:first])
        result.failed.update(sent.failed)
        result.answered = sent.answered - set(sent.failed)
        for name, reply in zip(names, replies[first:], strict=True):
            if isinstance(reply, Exception):  # its shard is down, or the script failed
                result.failed.setdefault(shard_of(client, name), reply)
                continue
            lost, cancelled, _ = LeaseCalls.parse_extend(reply)
            lost_set = set(lost)
            for job_id, _token in by_queue[name]:
                if job_id not in lost_set and job_id in self._proven:
                    self._proven[job_id] = sent_at + self.ttl
                    result.confirmed += 1
            result.lost += lost
            result.cancelled += cancelled
        result.answered -= set(result.failed)
        return result

    def provable(self, sent_at: float, now: float | None = None) -> bool:
        """Whether a lease whose claim was sent at `sent_at` is still proven (with the
        safety margin): a supervisor stopped between a claim and the fork must not fork
        a child for a lease another supervisor may have reclaimed meanwhile."""
        now = time.monotonic() if now is None else now
        return sent_at + self.ttl - self.margin > now

    def unproven(self, now: float | None = None) -> list[str]:
        """Leases whose proof runs out within the safety margin."""
        now = time.monotonic() if now is None else now
        return [j for j, until in self._proven.items() if until - self.margin <= now]

    def fence_at(self, job_id: str) -> float | None:
        """Monotonic time at which this lease stops being proven (what `unproven` goes
        by): the fork server kills the job's child then, should this supervisor be
        frozen and unable to do it itself."""
        until = self._proven.get(job_id)
        return None if until is None else until - self.margin

    def next_expiry(self) -> float | None:
        """Monotonic time at which the first lease becomes unproven, if any."""
        if not self._proven:
            return None
        return min(self._proven.values()) - self.margin
