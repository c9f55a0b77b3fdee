"""The `[[queue]]` tables: the queues this supervisor serves.

Each field of `QueueConfig` is the row of its key (`schema.key`): a new queue option is
one field here plus the code that uses it. A `[[queue]]` may also set any job policy
key (`forq.defaults`), which becomes that queue's override of `[defaults]`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forq.channel import MAX_THROTTLE_MS
from forq.defaults import QUEUE
from forq.payload import MAX_NAME
from forq.store.events import MAX_KEEP
from forq.supervisor.config import fields as read
from forq.supervisor.config import schema
from forq.supervisor.config.sandbox import NETWORKS
from forq.supervisor.config.schema import REQUIRED, key

MAX_PREFETCH = 1000  # leases held ahead of free slots, per queue
DEFAULT_MAX_THROTTLE = 600.0  # s: a handler pauses its queue (or group) 10 minutes at most
MAX_THROTTLE = MAX_THROTTLE_MS / 1000  # what the channel carries at most (24 h)


def _max_throttle(value: object, where: str) -> float:
    seconds = read.duration(value, where)
    if seconds > MAX_THROTTLE:
        raise read.expected(where, 'a duration up to "24h" (0: throttles pause nothing)', value)
    return seconds


def _prefetch(value: object, where: str) -> int | str:
    """A number of jobs (0-MAX_PREFETCH), or "auto"."""
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_PREFETCH:
        return value
    raise read.expected(where, f'"auto" or an integer from 0 to {MAX_PREFETCH}', value)


TASK_NAME = f"a task name of 1 to {MAX_NAME} characters"


def _task_name(value: object, where: str) -> str:
    name = read.string(value, where, TASK_NAME)
    if len(name) > MAX_NAME:
        raise read.expected(where, TASK_NAME, value)
    return name


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
    # "auto": a few, only while the queue's jobs are short (`held.ShortJobs`)
    prefetch: int | str = key(
        "auto", read.Reader(f'"auto" or an integer from 0 to {MAX_PREFETCH}', _prefetch),
        'Jobs leased ahead of a free slot; `"auto"`: 4 while the queue\'s jobs run <= 10 ms.')
    # a handler's `current().throttle(...)`, cut to this: however it is written, a
    # handler cannot hold its queue (or a group of it) for longer at once
    max_throttle: float = key(
        "10m", read.Reader('a duration up to "24h"', _max_throttle),
        "The longest a handler's `throttle` pauses this queue or a group (0: throttles do nothing).")
    # kept in Redis like the limits above, and written only when set: `forq events
    # --enable/--disable` at run time stays until a config sets it
    events: bool | None = key(
        None, read.BOOLEAN,
        "`false`: write no events for the queue (unset: as set at run time, on by default).",
        shown="on")
    events_keep: int | None = key(
        None, read.integers(1, MAX_KEEP),
        "Events kept in the queue's stream, about (~100 bytes each: 10000 ~ 1 MB).",
        shown="10000")
    on_dead: str | None = key(
        None, read.Reader(TASK_NAME, lambda value, where: _task_name(value, where)),
        "Task enqueued on this queue, with kwargs {job_id, task, reason}, when a job dies.")

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
