"""Retention at scrape time: how many ended records each served queue keeps, and how
much room Redis has left (docs/operations/retention.md).

``forq_retained_jobs{queue,state}`` (succeeded, dead) and the Redis headroom,
``forq_redis_memory_used_bytes`` beside ``forq_redis_memory_max_bytes`` (0: no
``maxmemory``), for the alert ``ForqRedisMemoryHigh``. Read from Redis when scraped, as
the queue depths are: one pipelined round trip and one INFO. A failing read drops these
samples and counts ``forq_redis_errors_total{op="scrape"}``; the scrape still succeeds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from forq.store.control import KEPT_STATES, bucket_state
from forq.store.keys import QueueKeys

log = logging.getLogger("forq.supervisor")


def read_retained(client: Any, names: list[str]) -> dict[str, dict[str, int]]:
    """Each queue's kept records by state: its retention buckets' sizes, and its dead set
    (which also holds dead jobs from before retention)."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        k = QueueKeys(name)
        pipe.smembers(k.kept)
        pipe.zcard(k.dead)
    replies = pipe.execute()
    out: dict[str, dict[str, int]] = {}
    buckets: list[tuple[str, str]] = []
    for i, name in enumerate(names):
        out[name] = {"succeeded": 0, "dead": int(replies[2 * i + 1])}
        buckets += [(name, str(b)) for b in replies[2 * i] if bucket_state(str(b)) == "succeeded"]
    if buckets:
        pipe = client.pipeline(transaction=False)
        for name, bucket in buckets:
            pipe.zcard(QueueKeys(name).kept_bucket(bucket))
        for (name, _), n in zip(buckets, pipe.execute(), strict=True):
            out[name]["succeeded"] += int(n)
    return out


def read_memory(client: Any) -> tuple[int, int]:
    """Redis's used_memory and maxmemory (0: none). On a cluster, the fullest node's."""
    info = client.info("memory")
    nodes = [info] if "used_memory" in info else [v for v in info.values() if isinstance(v, dict)]
    pairs = [(int(n.get("used_memory", 0)), int(n.get("maxmemory", 0))) for n in nodes]
    return max(pairs, key=lambda p: p[0] / p[1] if p[1] else 0.0, default=(0, 0))


class RetentionCollector(Collector):
    def __init__(self, client: Callable[[], Any], names: Callable[[], list[str]],
                 on_error: Callable[[], None]) -> None:
        self.client, self.names, self.on_error = client, names, on_error

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (GaugeMetricFamily("forq_retained_jobs", "Ended jobs' records kept, per queue and "
                                  "state (docs/operations/retention.md).",
                                  labels=["queue", "state"]),
                GaugeMetricFamily("forq_redis_memory_used_bytes", "Redis used_memory."),
                GaugeMetricFamily("forq_redis_memory_max_bytes",
                                  "Redis maxmemory (0: no limit)."))

    def describe(self) -> Iterable[Any]:
        return list(self._families())

    def collect(self) -> Iterable[Any]:
        kept, used, most = self._families()
        try:
            client = self.client()
            retained = read_retained(client, sorted(self.names()))
            memory = read_memory(client)
        except Exception:  # a scrape must survive any reader failure
            log.debug("retention read failed; skipping its samples", exc_info=True)
            self.on_error()
            return [kept, used, most]
        for queue, states in retained.items():
            for state in KEPT_STATES:
                kept.add_metric([queue, state], float(states[state]))
        used.add_metric([], float(memory[0]))
        most.add_metric([], float(memory[1]))
        return [kept, used, most]
