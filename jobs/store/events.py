"""A queue's events, read: the capped Redis stream the transition scripts write
(lua/includes/events.lua), as `QueueEvent`s.

Sans-IO, like `forq.store.plans`: `EventReader` says which command to send next and
turns its reply into events, so `Queue.events` and `AsyncQueue.events` drive the same
reader, each with its own I/O; `wait` is `job.wait`'s plan (it blocks on the stream
instead of polling the job), and the settings plans read and write the queue's switch,
cap and on_dead task (fields of its limits hash, read by the scripts). `QueueEvents` and
`AsyncQueueEvents` are those calls as `Queue` and `AsyncQueue` offer them (mixins).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis

from forq.errors import JobNotFound
from forq.job import TERMINAL
from forq.store.keys import QueueKeys
from forq.store.plans import Command, Plan, Record

# every kind a script writes, in the order of a job's life (docs/guide/events.md)
KINDS = ("enqueued", "replaced", "started", "progress", "failed", "retried", "snoozed",
         "released", "succeeded", "dead", "cancelled", "requeued",
         "tripped", "resumed")  # a task's circuit breaker (docs/guide/breaker.md)
ENDS = TERMINAL  # the kinds that end a job: succeeded, dead, cancelled
DEFAULT_KEEP = 10000  # entries a queue keeps unless set (the scripts' EVENTS_KEEP)
MAX_KEEP = 1_000_000  # a cap above this is refused: about 100 MB of stream
PAGE = 500  # entries per read
RECHECK_S = 1.0  # a waiter re-reads its job this often, whatever the stream says
_OWN = ("event", "id", "task", "supervisor", "reason")
T = TypeVar("T")


@dataclass(frozen=True)
class QueueEvent:
    """One entry of a queue's event stream: `kind` happened to job `job_id`."""

    stream_id: str  # "1712345678901-0": its place in the stream; the part before "-" is ms
    queue: str
    kind: str  # one of KINDS
    job_id: str
    task: str | None = None
    supervisor: str | None = None  # the one the job runs or ran on (or claimed it)
    reason: str | None = None  # why it failed, died, was released or cancelled
    fields: dict[str, str] = field(default_factory=dict)  # the kind's own: state, attempt, …

    @property
    def at(self) -> float:
        """When, in Unix seconds of the Redis clock."""
        try:
            return int(self.stream_id.split("-", 1)[0]) / 1000.0
        except ValueError:
            return 0.0

    def to_dict(self) -> dict[str, Any]:
        """The shape `forq events --json` prints, one object per line."""
        out: dict[str, Any] = {"stream_id": self.stream_id, "at": self.at, "queue": self.queue,
                               "event": self.kind, "id": self.job_id}
        for name in ("task", "supervisor", "reason"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        out.update(self.fields)
        return out


def entries_kept(value: Any) -> int:
    """The queue's `events` field as the scripts read it: absent or not a number, the
    default; otherwise its integer part within 0 (off) and MAX_KEEP."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return DEFAULT_KEEP
    if number != number:  # NaN
        return DEFAULT_KEEP
    return int(max(0.0, min(float(MAX_KEEP), number)))


def parse_entry(queue: str, entry: Sequence[Any]) -> QueueEvent:
    """A stream entry (id, {field: value}) as an event; fields it lacks are None."""
    stream_id, raw = entry[0], entry[1] or {}
    values = {str(k): str(v) for k, v in dict(raw).items()}
    return QueueEvent(str(stream_id), queue, values.get("event", ""), values.get("id", ""),
                      values.get("task"), values.get("supervisor"), values.get("reason"),
                      {k: v for k, v in values.items() if k not in _OWN})


def xread_entries(reply: Any) -> list[Any]:
    """XREAD's entries for its one stream, RESP2 ([[key, entries]]) or RESP3 ({key:
    entries}); [] when it timed out (None)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        found = next(iter(reply.values()))
        return list(found[0] if found and isinstance(found[0], list) else found)
    return list(reply[0][1])


def xread(key: str, after: str, block_ms: int, count: int = PAGE) -> tuple[Any, ...]:
    return ("XREAD", "COUNT", count, "BLOCK", max(1, block_ms), "STREAMS", key, after)


class EventReader:
    """Which command to send next (`command`, None when done) and the events in its
    reply (`feed`). `since`: a stream id to read after ("0": all that is kept; "$": only
    what comes next); `last`: start with the newest `last` kept instead; `follow`: then
    wait for new ones (XREAD BLOCK, at most `block` s a call) until `timeout` s passed
    (None: until the caller stops)."""

    def __init__(self, keys: QueueKeys, *, since: str = "0", last: int | None = None,
                 follow: bool = False, timeout: float | None = None, block: float = 1.0,
                 page: int = PAGE) -> None:
        if last is not None and (not isinstance(last, int) or last < 0):
            raise ValueError(f"last must be an integer >= 0, got {last!r}")
        if not isinstance(since, str) or not since:
            raise ValueError(f"since must be a stream id, \"0\" or \"$\", got {since!r}")
        self.keys = keys
        self.follow = follow
        self.block = block
        self.page = page
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.cursor = since
        self.phase = "last" if last is not None else ("newest" if since == "$" else "range")
        self.last = last or 0

    def command(self) -> tuple[Any, ...] | None:
        key = self.keys.events
        if self.phase == "last":
            return ("XREVRANGE", key, "+", "-", "COUNT", max(1, self.last))
        if self.phase == "newest":
            return ("XREVRANGE", key, "+", "-", "COUNT", 1)
        if self.phase == "range":
            start = "-" if self.cursor in ("0", "0-0") else f"({self.cursor}"
            return ("XRANGE", key, start, "+", "COUNT", self.page)
        if self.phase == "follow":
            left = None if self.deadline is None else self.deadline - time.monotonic()
            if left is not None and left <= 0:
                self.phase = "done"
                return None
            wait = self.block if left is None else min(self.block, left)
            return xread(key, self.cursor, int(wait * 1000), self.page)
        return None

    def feed(self, reply: Any) -> list[QueueEvent]:
        queue = self.keys.queue
        if self.phase in ("last", "newest"):
            entries = list(reversed(reply or []))  # newest first: oldest first now
            self.cursor = str(entries[-1][0]) if entries else "0-0"
            self.phase = "follow" if self.follow else "done"
            return [parse_entry(queue, e) for e in entries[-self.last:]] \
                if self.last else []
        if self.phase == "range":
            entries = list(reply or [])
            if entries:
                self.cursor = str(entries[-1][0])
            if len(entries) < self.page:
                self.phase = "follow" if self.follow else "done"
            return [parse_entry(queue, e) for e in entries]
        entries = xread_entries(reply)
        if entries:
            self.cursor = str(entries[-1][0])
        return [parse_entry(queue, e) for e in entries]


def wait(keys: QueueKeys, job_id: str, timeout: float, poll: float = 0.05,
         max_block: float | None = None) -> Plan[Record]:
    """`job.wait`'s reads: the job's record and history once it ended, or as they were
    when `timeout` s passed (the caller says which: `forq.job.settled`). Blocks on the
    queue's event stream (XREAD BLOCK) between reads, and reads the job again when its
    end shows there, or at least every RECHECK_S; a queue without events (its switch
    off) is read again after a block that grows from `poll` to 0.5 s, as polling did.
    `max_block`: the client's socket timeout, which a block must stay under."""
    deadline = time.monotonic() + timeout
    limit = RECHECK_S if max_block is None else under_timeout(RECHECK_S, max_block)
    newest, switch, record, history = yield [
        ("XREVRANGE", keys.events, "+", "-", "COUNT", 1), ("HGET", keys.limits, "events"),
        ("HGETALL", keys.job(job_id)), ("LRANGE", keys.history(job_id), 0, -1)]
    cursor = str(newest[0][0]) if newest else "0-0"
    interval = min(poll, 0.01)
    while True:
        if not record:
            raise JobNotFound(f"no job {job_id} in queue {keys.queue}")
        left = deadline - time.monotonic()
        if record.get("state") in TERMINAL or left <= 0:
            return record, history
        on = entries_kept(switch) > 0
        read_at = time.monotonic() + (limit if on else min(interval, limit))
        ended = False
        while not ended and time.monotonic() < min(read_at, deadline):
            block = min(read_at, deadline) - time.monotonic()
            (reply,) = yield [xread(keys.events, cursor, int(block * 1000) + 1)]
            entries = xread_entries(reply)
            if entries:
                cursor = str(entries[-1][0])
            ended = any(e[1].get("id") == job_id and e[1].get("event") in ENDS
                        for e in entries if e[1])
        interval = min(interval * 2, 0.5)
        switch, record, history = yield [
            ("HGET", keys.limits, "events"), ("HGETALL", keys.job(job_id)),
            ("LRANGE", keys.history(job_id), 0, -1)]


# -- the queue's settings (its limits hash; written at a supervisor's start by its config)


def settings(keys: QueueKeys) -> Plan[dict[str, Any]]:
    """{"events": on or off, "keep": entries kept, "on_dead": task or None}."""
    ((events, on_dead),) = yield [("HMGET", keys.limits, "events", "on_dead")]
    keep = entries_kept(events)
    return {"events": keep > 0, "keep": keep, "on_dead": on_dead}


def set_events(keys: QueueKeys, on: bool, keep: int | None = None) -> Plan[None]:
    """On (keeping about `keep` entries, DEFAULT_KEEP if None), or off: nothing more is
    written, and the stream goes (its memory with it)."""
    if not isinstance(on, bool):
        raise ValueError(f"on must be True or False, got {on!r}")
    if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int)
                             or not 1 <= keep <= MAX_KEEP):
        raise ValueError(f"keep must be an integer from 1 to {MAX_KEEP:,}, got {keep!r}")
    commands: list[Command]
    if on:
        commands = [("HSET", keys.limits, "events", keep or DEFAULT_KEEP)]
    else:
        commands = [("HSET", keys.limits, "events", 0), ("DEL", keys.events)]
    yield commands


def set_on_dead(keys: QueueKeys, task: str | None) -> Plan[None]:
    """The task enqueued (on this queue) when one of its jobs dies, or None for none."""
    from forq.payload import MAX_NAME

    if task is None:
        yield [("HDEL", keys.limits, "on_dead")]
        return
    if not isinstance(task, str) or not 0 < len(task) <= MAX_NAME:
        raise ValueError(f"on_dead must be a task name of 1 to {MAX_NAME} characters, "
                         f"got {task!r}"[:300])
    yield [("HSET", keys.limits, "on_dead", task)]


def socket_timeout(client: Any) -> float | None:
    """The client's socket timeout (s), which a blocking read must stay under; None when
    it has none (or it cannot be known: a cluster client's nodes have their own)."""
    pool = getattr(client, "connection_pool", None)
    value = (getattr(pool, "connection_kwargs", None) or {}).get("socket_timeout")
    return float(value) if value else None


def under_timeout(block: float, limit: float) -> float:
    """A block of at most `block` s whose reply comes before a socket timeout of `limit`
    s: at most half of it. Redis times blocked reads out at its event loop's pace (10 Hz
    by default), so up to 0.1 s late, and a loaded host or network adds its own delay:
    a fixed 0.2 s margin was not enough beside a busy test suite."""
    return max(0.001, min(block, limit / 2))


def reader_block(client: Any, block: float) -> float:
    """`block` s, or less when the client's socket timeout is shorter."""
    limit = socket_timeout(client)
    return block if limit is None else under_timeout(block, limit)


# -- the queues' events API: mixins of Queue and AsyncQueue, which bring `keys`, `redis`
# and `_run` (a plan run with their own I/O)


class QueueEvents:
    """`Queue`'s events calls."""

    keys: QueueKeys
    redis: redis.Redis

    def _run(self, plan: Plan[T]) -> T:
        raise NotImplementedError

    def events(self, *, since: str = "0", last: int | None = None, follow: bool = False,
               timeout: float | None = None, block: float = 1.0) -> Iterator[QueueEvent]:
        """The queue's events, oldest first: every one kept (since="0"), those after a
        stream id (an event's `stream_id`), or the newest `last`; with follow=True, then
        each new one as it comes (XREAD BLOCK, at most `block` s a call), until
        `timeout` s passed (None: until you stop iterating). See docs/guide/events.md."""
        reader = EventReader(self.keys, since=since, last=last, follow=follow,
                             timeout=timeout, block=reader_block(self.redis, block))
        while (command := reader.command()) is not None:
            yield from reader.feed(self.redis.execute_command(*command))

    def set_events(self, on: bool = True, *, keep: int | None = None) -> None:
        """Write the queue's events (about `keep` entries kept, 10,000 unless given), or
        stop (on=False: nothing more is written and the stream is deleted). Every
        supervisor and producer follows at its next call; `[[queue]] events` sets it."""
        self._run(set_events(self.keys, on, keep))

    def set_on_dead(self, task: str | None) -> None:
        """Enqueue `task` on this queue, with kwargs {job_id, task, reason}, whenever one
        of its jobs dies (in the same script as the death), or None for nothing.
        `[[queue]] on_dead` sets it."""
        self._run(set_on_dead(self.keys, task))

    def event_settings(self) -> dict[str, Any]:
        """{"events": on or off, "keep": entries kept, "on_dead": task or None}."""
        return self._run(settings(self.keys))


class AsyncQueueEvents:
    """`AsyncQueue`'s events calls: `Queue`'s, awaited."""

    keys: QueueKeys
    redis: aioredis.Redis

    async def _run(self, plan: Plan[T]) -> T:
        raise NotImplementedError

    async def events(self, *, since: str = "0", last: int | None = None,
                     follow: bool = False, timeout: float | None = None,
                     block: float = 1.0) -> AsyncIterator[QueueEvent]:
        """The queue's events, as `Queue.events`: ``async for event in queue.events()``."""
        reader = EventReader(self.keys, since=since, last=last, follow=follow,
                             timeout=timeout, block=reader_block(self.redis, block))
        while (command := reader.command()) is not None:
            for event in reader.feed(await self.redis.execute_command(*command)):
                yield event

    async def set_events(self, on: bool = True, *, keep: int | None = None) -> None:
        """The queue's events on (about `keep` entries kept) or off (`Queue.set_events`)."""
        await self._run(set_events(self.keys, on, keep))

    async def set_on_dead(self, task: str | None) -> None:
        """The task enqueued when one of the queue's jobs dies (`Queue.set_on_dead`)."""
        await self._run(set_on_dead(self.keys, task))

    async def event_settings(self) -> dict[str, Any]:
        """{"events": on or off, "keep": entries kept, "on_dead": task or None}."""
        return await self._run(settings(self.keys))
