"""Reporter: tell Redis how each finished child ended, and read what Redis answered.

A report is one fenced transition (`ack`, `fail`, `expire`, `release`) queued on the
supervisor's pipeline beside the claims of the same loop turn, so a finished job's slot
is refilled in the same round trip. A report that cannot be sent (Redis down) stays in
the outbox and is sent again: each is fenced by its token, so one that did land the
first time is answered "lost" the second time and changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from forq import Queue
from forq.defaults import IDEMPOTENCY_TTL_MS
from forq.store import topology
from forq.store import transitions as tr
from forq.store.keys import QueueKeys
from forq.store.transitions import parse_progress
from forq.supervisor.children.cost import cost_of, measure
from forq.supervisor.children.outcomes import Kind, Metric, Outcome
from forq.supervisor.children.running import RunningChild
from forq.supervisor.fork.protocol import TaskInfo
from forq.supervisor.leases.calls import LeaseCalls, leasing
from forq.supervisor.leases.keeper import LeaseKeeper
from forq.supervisor.observe import tracing
from forq.supervisor.observe.metrics import Metrics
from forq.supervisor.redis_io.notes import JobNotes

log = logging.getLogger("forq.supervisor")

# ack_many's: id, token, result, follow-ups, the run's cost
AckArgs = tuple[str, str, str, list[dict[str, Any]], str]


@dataclass
class Pending:
    """A finished child's report waiting for Redis."""

    child: RunningChild
    outcome: Outcome
    token: str
    # its last progress, taken from the child, sent first (replies[0]), again on a retry
    progress: tuple[str, str, float, str] | None = None
    # what its ack needs written by other scripts first (the batch its handler opened,
    # its follow-ups on other queues) goes alone (`writing`: how many commands), its ack
    # only once Redis wrote them (`written`). In one pipeline, a full Redis refuses those
    # scripts (batch.lua, enqueue.lua) but lets the ack land: they would be lost
    writing: int = 0
    written: bool = False
    refused: bool = False  # a full Redis refused it once (said once, then sent again)
    ended: float = field(default_factory=time.monotonic)  # when the child's end was seen


def queues_touched(item: Pending) -> set[str]:
    """Every queue `item`'s report writes to: its own, its follow-ups', its batch's."""
    names = {item.child.queue, *(f["queue"] for f in item.outcome.followups)}
    if item.outcome.batch is not None:
        names.update(m["queue"] for m in item.outcome.batch["members"])
    return names


def open_batch(q: Queue, job_id: str, token: str, opened: dict[str, Any],
               queue_for: Callable[[str], Queue], pipe: Any) -> None:
    """Queue the opening of the batch job `job_id`'s handler opened (checked by
    `messages.check_opened_batch`) before its ack: the members on other queues first
    (deterministic ids: a re-run adds none), then the batch with its members on this
    queue, fenced by the job's token (a stale report opens nothing)."""
    members = opened["members"]
    record: dict[str, Any] = {"total": len(members),
                              "members": [[m["queue"], m["id"]] for m in members]}
    for name in ("on_success", "on_complete"):
        if name in opened:
            record[name] = opened[name]
    for other in sorted({m["queue"] for m in members} - {q.name}):
        queue_for(other).send_specs([m for m in members if m["queue"] == other], pipe)
    leasing(q).open_batch(opened["id"], record, [m for m in members if m["queue"] == q.name],
                          opener=job_id, token=token, client=pipe)


class Reporter:
    def __init__(self, queue_for: Callable[[str], Queue], leases: LeaseKeeper,
                 metrics: Metrics, min_replicas: int = 0, wait_ms: int = 0,
                 task_info: Callable[[str], TaskInfo | None] = lambda _task: None) -> None:
        self.queue_for = queue_for
        self.leases = leases
        self.metrics = metrics
        self.min_replicas = min_replicas  # [redis].min_replicas: WAIT after the reports
        self.wait_ms = wait_ms
        # inside send_batch: each queue's acks, (item, ack_many's tuple), sent together
        self._acks: dict[str, list[tuple[Pending, AckArgs]]] | None = None
        # a task's registration (`idempotent=True`), as the fork server reported it
        self.task_info = task_info
        self.meter = True  # [supervisor].job_cost: each run's cost in its report
        # reports to send again (their batch opened, or not yet): `take_again`
        self.again: list[Pending] = []
        self.again_errors: list[Exception] = []

    def send_batch(self, pipe: Any, batch: list[Pending]) -> list[tuple[int, int, int, int]]:
        """Queue every item's transition on `pipe`, the acks of one queue together in one
        ack call after the batch's other commands (so what must land before an ack — a
        completion record, follow-ups to other queues — still does). Returns, per item,
        where its replies will be, for `answer_batch`."""
        self._acks = {}
        spans: list[tuple[int, int, str | None, int]] = []
        try:
            for item in batch:
                start = len(pipe.command_stack)
                self.send(pipe, item)
                group = self._acks.get(item.child.queue)
                if group and group[-1][0] is item:  # its ack waits for the queue's call
                    spans.append((start, len(pipe.command_stack), item.child.queue,
                                  len(group) - 1))
                else:
                    spans.append((start, len(pipe.command_stack), None, -1))
        finally:
            acks, self._acks = self._acks, None
        ack_at = {}
        for name, group in acks.items():
            ack_at[name] = len(pipe.command_stack)
            leasing(self.queue_for(name)).ack_many([ack for _, ack in group], client=pipe)
        return [(start, end, ack_at[name] if name else -1, position)
                for start, end, name, position in spans]

    def answer_batch(self, batch: list[Pending], spans: list[tuple[int, int, int, int]],
                     replies: list[Any]) -> None:
        """`answered` for each item of a `send_batch`, with its own ack's answer last."""
        for item, (start, end, ack_at, position) in zip(batch, spans, strict=True):
            mine = replies[start:end]
            if ack_at >= 0:
                reply = replies[ack_at]
                mine.append(reply if isinstance(reply, Exception)
                            else LeaseCalls.parse_acks(reply)[position])
            self.answered(item, mine)

    def send(self, pipe: Any, item: Pending) -> None:
        """Queue `item`'s transition (and what goes with it) on `pipe` (inside
        `send_batch`, an ack waits for the batch's one ack call of its queue)."""
        child, outcome, token = item.child, item.outcome, item.token
        q = leasing(self.queue_for(child.queue))
        job_id = child.job_id
        if item.progress is None:  # its last, if not yet written
            item.progress = JobNotes.progress_entry(child, token)
        if item.progress is not None:
            q.record_progress([item.progress], client=pipe)
        output = child.out.record()
        # the death report's memory samples: for a job that did not succeed
        trail = "" if outcome.kind is Kind.ACK else child.trail.json(item.ended)
        if output or trail:  # before the transition: it needs the lease still held
            q.set_output(job_id, token, output, client=pipe, trail=trail)
        if outcome.kind is Kind.ACK:
            same = [f for f in outcome.followups if f["queue"] == child.queue]
            # other queues' follow-ups first (deterministic ids, so a re-run adds none):
            # Redis runs the pipeline in order, so once a completion record exists they do
            others = sorted({f["queue"] for f in outcome.followups} - {child.queue})
            if (others or outcome.batch is not None) and not item.written:
                start = len(pipe.command_stack)
                for other in others:
                    specs = [f for f in outcome.followups if f["queue"] == other]
                    self.queue_for(other).send_specs(specs, pipe)
                if outcome.batch is not None:
                    open_batch(q.queue, job_id, token, outcome.batch, self.queue_for, pipe)
                item.writing = len(pipe.command_stack) - start  # the ack waits: `wrote`
                return
            fields = child.lease.job.fields
            task = self.task_info(child.task)
            if fields.get("idempotent") in ("1", 1) or (task is not None and task.idempotent):
                ttl = int(fields.get("idempotency_ttl_ms") or IDEMPOTENCY_TTL_MS)
                # with the same-queue follow-ups: if this ack is lost, the reclaim that
                # finds the completion enqueues them instead
                q.record_done(job_id, outcome.result_json, ttl, same, client=pipe)
            ack = (job_id, token, outcome.result_json, same, self.cost(child))
            if self._acks is None:
                q.ack_many([ack], client=pipe)
            else:
                self._acks.setdefault(child.queue, []).append((item, ack))
        elif outcome.kind is Kind.FAIL:
            q.fail(job_id, token, outcome.error, outcome.mode.value, client=pipe,
                   delay_ms=outcome.delay_ms, counted=outcome.counted, pattern=outcome.pattern,
                   cost=self.cost(child))
        elif outcome.kind is Kind.THROTTLE:
            q.throttle(job_id, token, outcome.delay_ms, outcome.group, outcome.reason,
                       client=pipe)
        elif outcome.kind is Kind.EXPIRE:
            q.expire(job_id, token, outcome.reason, client=pipe, pattern=outcome.pattern,
                     cost=self.cost(child))
        elif outcome.kind is Kind.RELEASE:
            q.release(job_id, token, outcome.reason, client=pipe)

    def cost(self, child: RunningChild) -> str:
        """`child`'s cost for its report ("" none: not metered, or never started)."""
        return cost_of(child) if self.meter else ""

    def wrote(self, item: Pending, replies: list[Any]) -> bool:
        """The answers to what `item`'s ack needs written first: written (its ack goes
        next), or refused by a full Redis (sent again after a backoff). False when the
        report goes on: in `again`. True: the batch's opening found the lease lost."""
        refused = next((r for r in replies if isinstance(r, Exception)), None)
        if isinstance(refused, redis.OutOfMemoryError):
            log.warning("job %s %s: the batch it opened or its follow-ups on other queues "
                        "could not be written yet (%s); its ack waits", item.child.job_id,
                        item.child.task, refused)
            self.again.append(item)
            self.again_errors.append(refused)
            return False
        if refused is not None:  # not Redis being full: as before, the ack goes anyway
            log.error("job %s %s: writing its batch or follow-ups failed: %s",
                      item.child.job_id, item.child.task, refused)
        elif item.outcome.batch is not None and tr.parse_batch(replies[-1]).status == "lost":
            return True
        item.written = True
        self.again.append(item)
        return False

    def take_again(self) -> tuple[list[Pending], list[Exception]]:
        """The reports to send again, and why any could not go (for the backoff)."""
        again, errors = self.again, self.again_errors
        self.again, self.again_errors = [], []
        return again, errors

    def send_waits(self, pipe: Any, batch: list[Pending]) -> int:
        """WAIT after the reports, on the connection(s) that sent them (one per shard in
        a cluster). Returns how many WAIT replies come last."""
        if not self.min_replicas or not batch:
            return 0
        names = {item.child.queue for item in batch}
        for item in batch:
            names.update(f["queue"] for f in item.outcome.followups)
        return topology.queue_wait(pipe, self.min_replicas, self.wait_ms,
                                   [QueueKeys(name).active for name in sorted(names)])

    def check_waits(self, batch: list[Pending], replies: list[Any], waits: int) -> list[Any]:
        """Log the reports that did not reach min_replicas in time; strip the WAITs."""
        if not waits:
            return replies
        short = topology.short_of(replies[-waits:], self.min_replicas)
        if short is not None:
            self.metrics.redis_error("replicate")
            log.warning("reports of job(s) %s not replicated: %d of %d replica(s) acknowledged "
                        "within %d ms; a failover now could undo them",
                        ", ".join(item.child.job_id for item in batch), short,
                        self.min_replicas, self.wait_ms)
        return replies[:-waits]

    def answered(self, item: Pending, replies: list[Any]) -> Metric | None:
        """Redis answered `item`'s commands: log it, count it. Returns the outcome
        counted in forq_jobs_finished_total (None: the report itself failed)."""
        child, outcome = item.child, item.outcome
        if item.writing:
            n, item.writing = item.writing, 0
            if not self.wrote(item, replies[-n:]):
                return None
            replies = ["lost"]  # the opening found the lease gone: as a lost ack
        last_reply: Any = replies[-1] if replies else None
        if isinstance(last_reply, redis.OutOfMemoryError):
            # a full Redis refused the transition itself (its first write may be one a
            # full Redis denies): the report waits, and its lease stays in the keeper,
            # extended (extend runs when Redis is full) until the report lands. Dropped
            # here, the lease would expire and the reaper would take the job as a crash
            # it cannot explain, or run a finished job again
            if not item.refused:
                log.warning("job %s %s: its report waits: %s", child.job_id, child.task,
                            last_reply)
            item.refused = True
            self.again.append(item)
            self.again_errors.append(last_reply)
            return None
        if self.leases.token(child.job_id) == item.token:
            self.leases.remove(child.job_id)  # not a newer lease of the same job
        metric: Metric | None = outcome.metric
        if item.progress is not None and replies and not isinstance(replies[0], Exception):
            self.metrics.progress_written(child.queue, parse_progress(replies[0]).count("ok"))
        last: Any = replies[-1] if replies else None
        if isinstance(last, Exception):
            log.error("job %s %s: report failed: %s", child.job_id, child.task, last)
            metric = None
        elif outcome.kind is Kind.FAIL:
            result = LeaseCalls.parse_fail(last)
            if result.outcome == "lost":
                metric = "lease_lost"
            elif result.outcome == "dead":
                metric = ("dead" if outcome.metric in ("failed", "dead", "snoozed")
                          else outcome.metric)
            elif result.outcome == "cancelled":
                metric = "cancelled"
            elif result.outcome == "retry" and outcome.metric == "failed":
                metric = "retried"
            log.info("job %s %s: %s → %s (attempt %d)", child.job_id, child.task,
                     outcome.reason or outcome.error.get("reason"), result.outcome,
                     result.attempts, extra={"job": child.job_id, "event": result.outcome})
        elif outcome.kind is Kind.THROTTLE:
            throttled = LeaseCalls.parse_throttle(last)
            metric = ("lease_lost" if throttled.outcome == "lost" else
                      "cancelled" if throttled.outcome == "cancelled" else
                      "dead" if throttled.outcome == "dead" else "throttled")
            scope = "its group" if outcome.group else "its queue"
            log.info("job %s %s throttled %s for %.3fs (%s): %s", child.job_id, child.task,
                     scope, outcome.delay_ms / 1000, outcome.reason, throttled.outcome,
                     extra={"job": child.job_id, "event": "throttled"})
        elif last == "lost":
            metric = "lease_lost"
            log.warning("job %s %s: %s answered lost (lease no longer ours); dropped",
                        child.job_id, child.task, outcome.kind)
        elif outcome.kind is Kind.DROP:
            log.warning("job %s %s: lease lost; result dropped", child.job_id, child.task)
        else:
            verb = {Kind.ACK: "succeeded", Kind.EXPIRE: "crashed",
                    Kind.RELEASE: "released"}[outcome.kind]
            # a chunk's successes: one line per chunk (`Children.ended`), each job's at debug
            level = logging.DEBUG if child.spec.chunk and verb == "succeeded" else logging.INFO
            log.log(level, "job %s %s %s%s in %.3fs", child.job_id, child.task, verb,
                     f" ({outcome.reason})" if outcome.reason else "",
                     time.monotonic() - child.started,
                     extra={"job": child.job_id, "event": verb})
        tracing.TRACER.finished(child.job_id, item.token, str(outcome.kind), metric,
                                outcome.reason or str(outcome.error.get("reason", "")))
        if metric and child.pid:
            self.metrics.job_finished(child.queue, child.task, metric,
                                      time.monotonic() - child.started, child.peak_rss or None)
            cost = measure(child) if self.meter else None
            if cost is not None:
                latency = cost.start_latency_ms
                self.metrics.cost.observe(child.queue, child.task, cost.cpu_seconds,
                                          cost.peak_bytes,
                                          None if latency is None else latency / 1000)
        elif metric:
            self.metrics.job_finished(child.queue, child.task, metric, 0.0, None)
        return metric
