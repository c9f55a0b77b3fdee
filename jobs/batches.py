"""Batches (fan-out / fan-in): open one, and read one back.

A batch's record lives in the slot of the queue it was opened on (`lua/batch.lua`);
its callbacks are enqueued there, exactly once, by the transition that ends its last
member (see ``links_ended`` in ``lua/includes/finish.lua``). These plans (`forq.store.plans`) are what
`Queue` and `AsyncQueue` send, so both open and read batches the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from forq.errors import JobNotFound
from forq.job import loads_field
from forq.store import keys as keyspace
from forq.store import transitions as tr
from forq.store.batchspec import BatchSpec
from forq.store.keys import QueueKeys
from forq.store.plans import Command, Plan

if TYPE_CHECKING:
    from forq.async_queue import AsyncQueue
    from forq.queue import Queue


def open_batch(batch: BatchSpec, *, register: bool = True) -> Plan[tr.BatchOpened]:
    """One round trip: the batch script (record and its queue's first members), then
    the rest of its queue's members and the other queues' members, in enqueue calls.
    A member on another queue that ends before the batch is open is counted when it
    opens (see batch.lua), so the order across slots does not matter."""
    keys = QueueKeys(batch.queue)
    own = batch.specs.get(batch.queue, [])
    commands: list[Command] = []
    if register:
        commands += [("SADD", keyspace.QUEUES, name) for name in sorted({batch.queue, *batch.specs})]
    at = len(commands)
    commands.append(tr.batch_call(keys, batch.id, batch.record, own[:tr.ENQUEUE_BATCH]))
    commands += tr.enqueue_calls(keys, own[tr.ENQUEUE_BATCH:])
    for name in sorted(set(batch.specs) - {batch.queue}):
        commands += tr.enqueue_calls(QueueKeys(name), batch.specs[name])
    replies = yield commands
    return tr.parse_batch(replies[at])


@dataclass
class BatchMember:
    id: str
    queue: str
    state: str  # "" when its record is gone (expired or purged)
    result: Any = None
    reason: str | None = None


@dataclass
class BatchStatus:
    id: str
    queue: str
    state: str  # "open", then "succeeded" (no member failed) or "failed"
    total: int
    ended: int  # members that ended (succeeded, dead or cancelled)
    failed: int
    opener: str | None = None  # the job that opened it from its handler
    parent_batch: str | None = None  # the opener's own batch
    callbacks: dict[str, str] = field(default_factory=dict)  # on_success/on_complete -> job id
    created_at: int = 0
    finished_at: int | None = None
    members: list[BatchMember] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["members"] = [m.__dict__ for m in self.members]
        return out


def read_batch(keys: QueueKeys, batch_id: str, members: bool = True) -> Plan[BatchStatus]:
    """The batch's record; with `members`, each member's state, result and reason (one
    more round trip, whatever their queues)."""
    bkey = keys.batch(batch_id)
    record, listed, ended, failed = yield [
        ("HGETALL", bkey), ("LRANGE", bkey + ":members", 0, -1), ("SMEMBERS", bkey + ":ended"),
        ("SCARD", bkey + ":failed")]
    if not record:
        raise JobNotFound(f"no batch {batch_id} in queue {keys.queue} (never opened, or its "
                          "record expired)")
    opener = record.get("opener")
    status = BatchStatus(
        batch_id, keys.queue, record.get("status", "open"), int(record.get("total", 0)),
        len(set(ended) - {opener}), int(failed), opener, record.get("parent_batch"),
        {name: json.loads(record[name])["id"] for name in ("on_success", "on_complete")
         if name in record},
        int(record.get("created_at", 0)),
        int(record["finished_at"]) if "finished_at" in record else None)
    if not members:
        return status
    pairs = [json.loads(entry) for entry in listed]
    replies = yield [("HMGET", QueueKeys(q).job(member_id), "state", "result", "dead_reason", "error")
                     for q, member_id in pairs]
    for (q, member_id), (state, result, dead_reason, error) in zip(pairs, replies, strict=True):
        reason = dead_reason
        if reason is None and error:
            err = loads_field(error)
            reason = err.get("reason") if isinstance(err, dict) else None
        status.members.append(BatchMember(member_id, q, state or "",
                                          loads_field(result) if result else None, reason))
    return status


class Batch:
    """A batch opened by `Queue.batch` (or found by `Queue.get_batch`)."""

    def __init__(self, queue: Queue, batch_id: str, member_ids: Sequence[str] = ()) -> None:
        self.id = batch_id
        self.queue = queue.name
        self._queue = queue
        self.member_ids = list(member_ids)

    def __repr__(self) -> str:
        return f"Batch({self.id!r}, queue={self.queue!r})"

    def status(self) -> BatchStatus:
        """State and counts (one round trip)."""
        return self._queue._run(read_batch(self._queue.keys, self.id, members=False))

    def results(self) -> list[BatchMember]:
        """Every member's state, result and reason, in the order they were given."""
        return self._queue._run(read_batch(self._queue.keys, self.id)).members


class AsyncBatch:
    """`Batch` for asyncio code."""

    def __init__(self, queue: AsyncQueue, batch_id: str, member_ids: Sequence[str] = ()) -> None:
        self.id = batch_id
        self.queue = queue.name
        self._queue = queue
        self.member_ids = list(member_ids)

    def __repr__(self) -> str:
        return f"AsyncBatch({self.id!r}, queue={self.queue!r})"

    async def status(self) -> BatchStatus:
        return await self._queue._run(read_batch(self._queue.keys, self.id, members=False))

    async def results(self) -> list[BatchMember]:
        return (await self._queue._run(read_batch(self._queue.keys, self.id))).members
