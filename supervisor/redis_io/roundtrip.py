"""RoundTrip: one pipeline a loop turn for everything that waits on Redis.

Claims for the free slots, durable steps, reads of parents' results, the finished
children's reports, reclaims of
the crashes just reported and the replication WAITs go out together; each part queues
its commands through `Trip.queue`, which notes the span of replies that is its own, and
reads back only that span. No part counts another's positions.

On a Redis error the reports stay queued and are sent again: each is fenced by its
token, so a report that did land the first time is answered "lost" the second, and
changes nothing. On a cluster the trip is one pipeline per shard (`shards`): a shard
that is down (or backing off) holds back only its own queues' claims, steps and reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from forq.supervisor.children.outcomes import Kind
from forq.supervisor.config.load import Config
from forq.supervisor.leases.keeper import LeaseKeeper
from forq.supervisor.redis_io.claimer import Claimer
from forq.supervisor.redis_io.health import RedisHealth
from forq.supervisor.redis_io.notes import JobNotes
from forq.supervisor.redis_io.queue_settings import ShardSettings
from forq.supervisor.redis_io.reaper import Reaper
from forq.supervisor.redis_io.reports import Pending, Reporter, queues_touched
from forq.supervisor.redis_io.shard_health import ShardHealth
from forq.supervisor.redis_io.shards import ShardDown, execute_by_shard

T = TypeVar("T")


class Trip:
    """One pipeline, and the span of replies each part queued on it."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe

    def queue(self, send: Callable[[Any], T]) -> tuple[T, slice]:
        """Run `send(pipe)`; returns what it returned and the span of its replies."""
        start = len(self.pipe.command_stack)
        out = send(self.pipe)
        return out, slice(start, len(self.pipe.command_stack))

    def __len__(self) -> int:
        return len(self.pipe.command_stack)


@dataclass
class TripResult:
    outbox: list[Pending]  # the reports still to send (before any new ones)
    claim_again: bool  # a claim came back full, or could not go: claim on the next turn


class RoundTrip:
    def __init__(self, client: Any, *, claimer: Claimer, notes: JobNotes, reporter: Reporter,
                 reaper: Reaper, settings: ShardSettings, leases: LeaseKeeper,
                 health: RedisHealth, shards: ShardHealth, sharded: bool,
                 on_answer: Callable[[], None]) -> None:
        self.client = client
        self.claimer = claimer
        self.notes = notes
        self.reporter = reporter
        self.reaper = reaper
        self.settings = settings
        self.leases = leases
        self.health = health
        self.shards = shards
        self.sharded = sharded
        self.on_answer = on_answer  # Redis answered: the supervisor's health, wake-ups

    def ready(self) -> bool:
        """Whether a trip may go now (on a cluster each shard gates its own part)."""
        return self.sharded or self.health.ready()

    def run(self, outbox: list[Pending], claiming: bool, config: Config) -> TripResult:
        """Send the claims (if `claiming`), the open steps and the reports in `outbox`;
        act on the answers."""
        if claiming and self.claimer.unsettled:
            self.settings.settle(config.queues)
        batch, held_back = self.shards.split_ready(outbox, queues_touched)
        trip = Trip(self.client.pipeline(transaction=False))
        # claims first: a global max_in_flight still counts our finished jobs, so the
        # ack's wake-up lets every supervisor race fairly for the freed slot
        asks, ask_span = trip.queue(
            lambda pipe: self.claimer.send(pipe, config) if claiming else [])
        # durable steps before the reports: a handler waits for them, and a step and
        # its job's ack sent in one turn must land in that order
        stepping, step_span = trip.queue(lambda pipe: self.notes.send_steps(
            pipe, self.leases.token, self.shards.ready if self.sharded else None))
        # reads of parents' results a handler waits for (each its own state machine)
        asking, ask_parents_span = trip.queue(lambda pipe: self.notes.parents.send(
            pipe, self.leases.token, self.shards.ready if self.sharded else None))
        spans = self.reporter.send_batch(trip.pipe, batch)
        # a crash reported now is reclaimed in the same trip, not a reaper tick later
        reap = sorted({item.child.queue for item in batch if item.outcome.kind is Kind.EXPIRE})
        _, reap_span = trip.queue(lambda pipe: self.reaper.send(pipe, reap))
        waits = self.reporter.send_waits(trip.pipe, batch)
        if not len(trip):  # nothing to send: the batch's reports need no command (a
            # result dropped with its lost lease), so they are done here, not kept: a
            # draining supervisor waits for its outbox to empty
            self.reporter.answer_batch(batch, spans, [])
            return TripResult(held_back, False)
        sent_at = time.monotonic()
        try:
            sent = execute_by_shard(trip.pipe, self.shards.failing())
        except (redis.RedisError, OSError) as exc:
            self.notes.steps_failed(stepping)
            self.health.failed("report" if batch else "claim", exc)
            return TripResult(batch + held_back, claiming)
        self.shards.failed(sent.failed, "report" if batch else "claim")
        self.shards.worked(sent.answered - set(sent.failed))
        self.on_answer()
        replies = self.reporter.check_waits(batch, sent.replies, waits)
        self.notes.steps_answered(stepping, replies[step_span])
        self.notes.parents.answered(asking, replies[ask_parents_span])
        # a report that did not reach one of its shards is sent again, whole, later
        retry = {i for i, span in enumerate(spans) if unsent(replies, span)}
        outbox = held_back
        if retry:
            outbox = [batch[i] for i in sorted(retry)] + outbox
            batch = [item for i, item in enumerate(batch) if i not in retry]
            spans = [span for i, span in enumerate(spans) if i not in retry]
        self.reporter.answer_batch(batch, spans, replies)
        self.reaper.ended(item.child.queue for item in batch)  # their records: trim soon
        again, refused = self.reporter.take_again()
        outbox = again + outbox
        if refused:  # a full Redis: try the batch's opening again after a backoff
            self.health.failed("report", refused[0])
        claim_again = False
        for name, reply in zip(asks, replies[ask_span], strict=True):
            if self.claimer.answered(name, reply, sent_at):
                claim_again = True  # a full batch: there may be more, and free slots
        for name, reply in zip(reap, replies[reap_span], strict=True):
            self.reaper.answered(name, reply)
        return TripResult(outbox, claim_again)


def unsent(replies: list, span: tuple[int, int, int, int]) -> bool:
    """Whether a report (its `Reporter.send_batch` span) met a shard that was down."""
    start, end, ack_at, _ = span
    mine = replies[start:end] + ([replies[ack_at]] if ack_at >= 0 else [])
    return any(isinstance(reply, ShardDown) for reply in mine)
