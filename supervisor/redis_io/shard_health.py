"""ShardHealth: backoff per shard of a Redis Cluster, so one shard that is down stops
only the claims, reports and steps of the queues it serves.

Each queue lives in one hash slot (``{queue}``), served by one node: its shard. After
a shard fails, the supervisor leaves it alone for a backoff (0.1 s doubling up to 5 s,
as `RedisHealth`) while it keeps claiming from and reporting to the others; the
leases held on it are fenced by their own proof (`LeaseKeeper`), not the others'.

On a plain Redis there is one shard (`forq.supervisor.redis_io.shards.PLAIN`), and its health is the
supervisor's `RedisHealth` itself: nothing changes there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from forq.store.topology import is_cluster
from forq.supervisor.redis_io.health import BACKOFF_MIN, RedisHealth
from forq.supervisor.redis_io.shards import PLAIN, shard_of

T = TypeVar("T")


class ShardHealth:
    def __init__(self, client: Any, whole: RedisHealth,
                 on_error: Callable[[str], None] = lambda _op: None,
                 on_down: Callable[[str], None] = lambda _shard: None,
                 on_up: Callable[[str], None] = lambda _shard: None) -> None:
        self.client = client
        self.whole = whole  # the supervisor's: heartbeats, schedules (and a plain Redis)
        self.on_error = on_error
        self.by_shard: dict[str, RedisHealth] = {}
        self.on_down = on_down  # a shard just failed
        self.on_up = on_up  # it answers again

    def shard(self, queue: str) -> str:
        return shard_of(self.client, queue)

    def of(self, shard: str) -> RedisHealth:
        if shard == PLAIN:
            return self.whole
        health = self.by_shard.get(shard)
        if health is None:
            health = self.by_shard[shard] = RedisHealth(self.on_error, self.whole.clock,
                                                        label=f"redis shard {shard}")
        return health

    def ready(self, queue: str) -> bool:
        """Whether to talk to `queue`'s shard now (not backing off after a failure)."""
        return self.of(self.shard(queue)).ready()

    def wait(self, queue: str) -> float:
        """Seconds until `queue`'s shard may be asked again (0: now)."""
        health = self.of(self.shard(queue))
        return max(0.0, health.down_until - health.clock())

    def split_ready(self, items: list[T], queues: Callable[[T], Iterable[str]]
                    ) -> tuple[list[T], list[T]]:
        """(the items whose every queue's shard is ready, the others, held back)."""
        if not self.by_shard:  # a plain Redis (gated as a whole), or no failure yet
            return items, []
        ready: list[T] = []
        held: list[T] = []
        for item in items:
            (ready if all(self.ready(name) for name in queues(item)) else held).append(item)
        return ready, held

    def failing(self) -> set[str]:
        """The shards whose last answer was a failure: a pipeline visits them last."""
        return {name for name, health in self.by_shard.items() if health.backoff > BACKOFF_MIN}

    def failed(self, failures: dict[str, BaseException], op: str) -> None:
        for shard, exc in failures.items():
            health = self.of(shard)
            first = health.backoff <= BACKOFF_MIN
            health.failed(op, exc)
            if first and shard != PLAIN:
                self.on_down(shard)

    def healthy_node(self) -> Any:
        """A primary whose shard is not failing (None: none known, or a plain Redis)."""
        if not is_cluster(self.client):
            return None
        failing = self.failing()
        for node in self.client.get_primaries():
            if node.name not in failing:
                return node
        return None

    def worked(self, shards: set[str]) -> None:
        for shard in shards:
            if self.of(shard).worked() and shard != PLAIN:
                self.on_up(shard)
