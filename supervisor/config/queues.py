"""The `[[queue]]` tables: the queues this supervisor serves.

Each field of `QueueConfig` is the row of its key (`schema.key`): a new queue option is
one field here plus the code that uses it. A `[[queue]]` may also set any job policy
key (`forq.defaults`), which becomes that queue's override of `[defaults]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forq.defaults import QUEUE
from forq.supervisor.config import fields as read
from forq.supervisor.config import schema
from forq.supervisor.config.sandbox import NETWORKS
from forq.supervisor.config.schema import REQUIRED, key

MAX_PREFETCH = 1000  # leases held ahead of free slots, per queue


@dataclass(frozen=True)
class QueueConfig:
    """One ``[[queue]]`` this supervisor serves: each field is its key's row (`schema.key`)."""

    name: str = key(
        REQUIRED, read.names(read.QUEUE_NAME_RE),
        "The queue's name.")
    concurrency: int = key(
        REQUIRED, read.integers(1),
        "Children this machine runs at once for the queue.")
    priority: int = key(
        0, read.integers(),
        "This supervisor serves higher-priority queues first.")
    nice: int = key(
        10, read.integers(0, 19),
        "Niceness of the children, so jobs never starve lease renewal.")
    # the limits below are shared by every supervisor serving the queue (kept in Redis)
    rate_limit: tuple[float, float] | None = key(
        None, read.RATE,
        "Job starts per period, across every supervisor.")
    max_in_flight: int | None = key(
        None, read.integers(1),
        "Jobs running at once, across every supervisor.")
    group_concurrency: int | None = key(
        None, read.integers(1),
        "Jobs of one group (enqueued with `group=`) running at once (unset: 1).")
    group_rate_limit: tuple[float, float] | None = key(
        None, read.RATE,
        "Job starts per group per period.")
    network: str | None = key(
        None, read.choices(*NETWORKS),
        "The jobs' network, over `[sandbox].network` (unset: that one).")
    # true: this supervisor pauses the queue (Queue.pause) when it starts and reloads;
    # false never resumes one (an operator's `forq pause` outlives restarts)
    paused: bool = key(
        False, read.BOOLEAN,
        "`true`: pause the queue everywhere at start and reload; `false` resumes none.")
    # see `supervisor/leases/held.py`: a slot starts its next job the moment its child
    # ends, without waiting for a claim's round trip
    prefetch: int = key(
        0, read.integers(0, MAX_PREFETCH),
        "Jobs leased ahead of a free slot, started without a claim's round trip.")

ROWS = schema.rows(QueueConfig, QUEUE)
POLICY_ROWS = schema.policy_rows(QUEUE)


def read_queues(
    doc: Mapping[str, Any],
) -> tuple[list[QueueConfig], dict[str, dict[str, int | float]]]:
    """The served queues, highest priority first, and each one's job policy overrides."""
    raw = doc.get("queue")
    if raw is None:
        raise read.Invalid("no queues: add at least one [[queue]] with name and concurrency")
    if not isinstance(raw, list):
        raise read.expected("queue", "an array of tables written [[queue]]", raw)
    if not raw:
        raise read.Invalid("no queues: add at least one [[queue]] with name and concurrency")
    queues: list[QueueConfig] = []
    overrides: dict[str, dict[str, int | float]] = {}
    for index, item in enumerate(raw, start=1):
        prefix = f"[queue {index}]"
        table = read.table(item, prefix)
        schema.check(table, ROWS + POLICY_ROWS, prefix)
        queue = QueueConfig(**schema.values(table, ROWS, prefix))
        if queue.name in overrides:
            raise read.Invalid(f'{prefix}.name: duplicate queue "{queue.name}"')
        queues.append(queue)
        overrides[queue.name] = schema.values(table, POLICY_ROWS, prefix)
    # Stable sort: queues of equal priority keep their order in the file.
    queues.sort(key=lambda q: -q.priority)
    return queues, overrides
