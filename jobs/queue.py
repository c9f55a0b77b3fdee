"""The queue API: what producers and operators call. The lease transitions only a
supervisor sends (claim, extend, ack, …) are not here: `forq.supervisor.leases.calls`.

Every state change is one Lua script call (see ``lua/``), built and parsed by
`forq.store.transitions`; this module sends them, alone or batched into pipelines.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

import redis

from forq import batches
from forq.batches import Batch
from forq.errors import JobNotFound, QueueFull, refused
from forq.job import Job
from forq.payload import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    batch_specs,
    call_spec,
    checked_priority,
)
from forq.store import control, dataformat, finder, plans, topology
from forq.store import keys as keyspace
from forq.store import transitions as tr
from forq.store.batchspec import build_batch
from forq.store.connection import connect
from forq.store.events import QueueEvents
from forq.store.finder import BulkResult, FoundPage, JobFilter
from forq.store.pipelines import can_stream, run_plan, stream_enqueue
from forq.store.policy import fill
from forq.store.scripts import Scripts
from forq.store.transitions import (  # re-exported: the supervisor and tests import them from here
    ENQUEUE_BATCH,
    RECLAIM_BATCH,
    ClaimResult,
    ExtendResult,
    FailOutcome,
    Lease,
    ReclaimResult,
)

__all__ = ["ENQUEUE_BATCH", "RECLAIM_BATCH", "ClaimResult", "ExtendResult", "FailOutcome",
           "Lease", "Queue", "ReclaimResult", "find_job", "known_queues"]

T = TypeVar("T")


class Queue(QueueEvents):
    """One named queue on one Redis.

    >>> q = Queue("emails", url="redis://127.0.0.1:6379/0")
    >>> job = q.enqueue("emails.send", "ada@example.com", priority=5, delay="30s")
    >>> job.wait(timeout=60)
    """

    def __init__(
        self,
        name: str = "default",
        redis: redis.Redis | None = None,
        url: str | None = None,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        min_replicas: int | None = None,
        wait_timeout: float | None = None,
    ) -> None:
        self.name = name
        self.keys = keyspace.QueueKeys(name)
        self.redis = redis if redis is not None else connect(url)
        self.max_payload_bytes = max_payload_bytes
        self.scripts = Scripts(self.redis)
        self._registered = False
        # durable enqueues (WAIT): None = the client's setting (topology.set_durability)
        self.min_replicas = min_replicas
        self.wait_timeout = wait_timeout
        self._policies: dict[str, dict[str, str]] = {}  # sha -> stored policy (immutable)

    # -- producing ---------------------------------------------------------------

    def enqueue(self, task: str, *args: Any, **options: Any) -> Job:
        """Enqueue one job; returns a handle whose `id` is the job's (or, for a
        duplicate idempotency `key`, the live job's that already holds the key).

        Options: args=, kwargs= (handler arguments, instead of positional args),
        priority (higher first), delay ("30s") or run_at (datetime / Unix seconds),
        key (idempotency key) and unique_for (keep the key after the job finishes),
        job_id, max_attempts, max_crashes, max_snoozes (a handler's own `Retry`s before
        dead, 100 unless set), timeout, memory_limit, result_ttl,
        max_result_bytes, backoff={base, factor, max, jitter}, idempotent, group (a
        key such as "customer-42": at most the queue's group_concurrency jobs of one
        group run at once, 1 unless set, see `set_limits`; other groups keep flowing),
        lifo=True (when it becomes pending it goes to the head of its priority, newest
        first, instead of the tail).
        replace=True, debounce="5s", key_scope="queued": what a held key does
        (docs/guide/events.md, "Replace and debounce").
        durable=True waits until at least one replica (or the queue's min_replicas)
        holds the job, else raises `NotReplicated`; durable=False never waits.
        """
        spec, durable = call_spec(task, args, options, self.max_payload_bytes)
        return self._enqueue_specs([spec], durable)[0]

    def enqueue_many(self, jobs: Iterable[Mapping[str, Any]], *,
                     durable: bool | None = None) -> list[Job]:
        """Enqueue many jobs in few round trips: each item is a mapping with ``task``
        and the options of `enqueue`. Every job is validated before any is sent, so a
        bad one refuses the whole batch and nothing is half-enqueued."""
        return self._enqueue_specs(batch_specs(jobs, self.max_payload_bytes), durable)

    def _enqueue_specs(self, specs: list[dict[str, Any]], durable: bool | None = None) -> list[Job]:
        dataformat.ensure(self.redis)  # once per client: never write what a newer forq reads
        replicas, wait_ms = topology.durability(self.redis, durable, self.min_replicas,
                                                self.wait_timeout)
        try:
            if not replicas and len(specs) > ENQUEUE_BATCH and can_stream(self.redis):
                if not self._registered:
                    self.redis.sadd(keyspace.QUEUES, self.name)
                    self._registered = True
                return stream_enqueue(self.redis, self.scripts, self.keys, specs,
                                      lambda job_id, status: Job.handle(self, job_id, status))
            enqueued = self._run(plans.enqueue(self.keys, specs, register=not self._registered,
                                               replicas=replicas, wait_ms=wait_ms))
        except redis.OutOfMemoryError as exc:
            raise QueueFull(self.name, len(specs), str(exc),
                            maybe_partial=len(specs) > ENQUEUE_BATCH) from None
        except redis.ResponseError as exc:
            raise refused(exc) from None
        self._registered = True
        return [Job.handle(self, job_id, status) for job_id, status in enqueued]

    def batch(self, jobs: Iterable[Mapping[str, Any]], on_success: Any = None,
              on_complete: Any = None, *, batch_id: str | None = None) -> Batch:
        """Enqueue `jobs` (as for `enqueue_many`; each may name another ``queue``) as one
        batch, and its callbacks: a task name or a mapping with ``task`` and options, run
        on this queue with ``batch_id`` in their kwargs. `on_complete` is enqueued once
        every member ended (succeeded, dead or cancelled), `on_success` only if every
        member succeeded: exactly once, atomically with the end of the last member.
        Opening it again with the same `batch_id` adds nothing."""
        spec = build_batch(self.name, jobs, on_success, on_complete, batch_id=batch_id,
                           max_payload_bytes=self.max_payload_bytes)
        dataformat.ensure(self.redis)
        try:
            self._run(batches.open_batch(spec))
        except redis.OutOfMemoryError as exc:
            raise QueueFull(self.name, spec.record["total"], str(exc), maybe_partial=True) from None
        except redis.ResponseError as exc:
            raise refused(exc) from None
        return Batch(self, spec.id, spec.member_ids)

    def get_batch(self, batch_id: str) -> Batch:
        """The batch opened on this queue under `batch_id`; `JobNotFound` if none is."""
        status = self._run(batches.read_batch(self.keys, batch_id, members=False))
        return Batch(self, status.id)

    def send_specs(self, specs: Sequence[Mapping[str, Any]], pipe: Any) -> int:
        """Queue enqueue calls for validated specs on a pipeline (also used by the
        supervisor for follow-up jobs bound for this queue). Returns how many
        replies the pipeline will hold for them."""
        queued = 0
        if not self._registered:
            pipe.sadd(keyspace.QUEUES, self.name)
            self._registered = True
            queued += 1
        for call in tr.enqueue_calls(self.keys, specs):
            self.scripts.run(call, pipe)
            queued += 1
        return queued

    def _stored_policy(self, sha: str) -> dict[str, str]:
        """The policy a claim stored under `sha` (named by content: cached for good)."""
        if sha not in self._policies:
            flat = self.redis.hgetall(self.keys.policy(sha))
            if not flat:
                return {}
            self._policies[sha] = {str(k): str(v) for k, v in flat.items()}
        return self._policies[sha]

    def _run(self, plan: plans.Plan[T]) -> T:
        return run_plan(self.redis, self.scripts, plan)

    # -- inspecting -------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        """The job's current record and history; `JobNotFound` if it does not exist."""
        record, history = self._run(plans.get(self.keys, job_id))
        if record.get("policy"):
            fill(record, self._stored_policy(record["policy"]))
        return Job.from_record(self, record, history)

    def stats(self) -> dict[str, Any]:
        """Counts per state, totals, the last minute's outcomes, and the oldest wait."""
        return self._run(plans.stats(self.keys))

    def dead(self, limit: int = 100) -> list[Job]:
        """The oldest dead jobs, with their reasons (two round trips however many)."""
        return [Job.from_record(self, record, history)
                for record, history in self._run(plans.dead(self.keys, limit))]

    # -- finding jobs, and acting on all of them (forq.store.finder) ---------------------

    def find(self, state: str = "pending", *, cursor: str | None = None, count: int = 100,
             **filters: Any) -> FoundPage:
        """One page of the jobs in `state` that pass the filters (task=, error= (a regular
        expression), since=, before=, args_contains=, group=: see `JobFilter`), in the
        order of the state's set, at most `count` in `page.jobs`. Pass `page.cursor` back
        for the next page; None means the walk is over. A page is bounded work: it may
        hold fewer than `count` jobs (even none) and a cursor when matches are sparse."""
        filt = JobFilter(state, **filters)
        page = self._run(finder.find(self.keys, filt, cursor, count))
        page.jobs = [Job.from_record(self, record, []) for record in page.records]
        return page

    def find_iter(self, state: str = "pending", *, limit: int | None = None,
                  **filters: Any) -> Iterator[Job]:
        """Every job in `state` that passes the filters (as `find`), page by page, up to
        `limit` jobs."""
        cursor: str | None = None
        seen = 0
        while True:
            page = self.find(state, cursor=cursor, count=100, **filters)
            for job in page.jobs:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield job
            cursor = page.cursor
            if cursor is None:
                return

    def bulk(self, action: str, state: str, *, limit: int | None = None,
             **filters: Any) -> BulkResult:
        """Do `action` to every job in `state` that passes the filters (as `find`), up to
        `limit`: "requeue" or "purge" (dead jobs), "cancel" (pending, scheduled, waiting
        or active), "promote" (scheduled). Each job is one atomic call: a match that
        changed before its turn (another state, its record trimmed) is skipped, counted
        in `result.skipped`."""
        return self._run(finder.act(self.keys, JobFilter(state, **filters), action, limit))

    # -- operator actions ----------------------------------------------------------

    def cancel(self, job_id: str) -> str:
        """Cancel a job: "cancelled", "cancelling" (active; its supervisor stops it within
        one lease-extension period), "missing", or the terminal state it already had."""
        return tr.parse_cancel(self.scripts.run(tr.cancel_call(self.keys, job_id)))

    def promote(self, job_id: str) -> str:
        """Run a scheduled job now (a delayed one, or a retry waiting out its backoff): it
        becomes pending at the tail of its priority. Returns "pending"; `JobStateError`
        when the job is not scheduled, `JobNotFound` when there is none."""
        return (self._run(plans.change(self.keys, tr.promote_call(self.keys, job_id),
                                            job_id))).state

    def reschedule(self, job_id: str, at: Any = None, *, delay: Any = None) -> str:
        """Give a pending or scheduled job a new run-at: `at` (a datetime or Unix seconds)
        or `delay` (a duration from now, by Redis's clock). A time not in the future runs
        it now. Returns its state then ("scheduled" or "pending"); `JobStateError` when it
        is in another state (a waiting job runs when its dependencies end) or its expiry
        before start would come first."""
        ms, relative = plans.new_run_at(at, delay)
        return (self._run(plans.change(
            self.keys, tr.reschedule_call(self.keys, job_id, ms, relative), job_id))).state

    def set_priority(self, job_id: str, priority: int) -> str:
        """Change the priority of a pending, scheduled or waiting job (higher runs first):
        a pending one moves to the tail of its new priority at once. Returns its state;
        `JobStateError` when it is running or finished."""
        priority = checked_priority(priority)
        return (self._run(plans.change(
            self.keys, tr.set_priority_call(self.keys, job_id, priority), job_id))).state

    def requeue_dead(self, ids: Sequence[str] | None = None, *, limit: int = 10000) -> tuple[int, list[str]]:
        """Requeue the given dead jobs (or all, up to `limit`). Returns (count, ids not dead)."""
        return tr.parse_dead_batch(self.scripts.run(tr.requeue_dead_call(self.keys, ids, limit)))

    def purge_dead(self, ids: Sequence[str] | None = None, *, limit: int = 10000) -> tuple[int, list[str]]:
        """Delete the given dead jobs (or all, up to `limit`). Returns (count, ids not dead)."""
        return tr.parse_dead_batch(self.scripts.run(tr.purge_dead_call(self.keys, ids, limit)))

    def pause(self) -> bool:
        """Stop claiming from this queue on every supervisor, at once; running jobs go on
        and keep their leases, enqueues wait. False when it was paused already."""
        return tr.parse_changed(self.scripts.run(tr.pause_call(self.keys)))

    def resume(self, task: str | None = None) -> bool:
        """Claim again, supervisors woken at once; False when it was not paused. `task`:
        untrip its circuit breaker instead (`plans.resume_task`), False when not tripped."""
        call = plans.resume_task(self.keys, task) if task else plans.script(tr.resume_call(self.keys))
        return self._run(call) if task else tr.parse_changed(self._run(call))

    def is_paused(self) -> bool:
        return self._run(plans.paused(self.keys))

    def throttle(self, duration: Any, *, group: str | None = None) -> float:
        """Claim nothing from this queue (or start no job of `group`) on any supervisor
        for `duration` ("60s", seconds), as a handler's `current().throttle` does; a
        throttle in force that ends later stays. Returns its end (Unix seconds, by
        Redis's clock). `unthrottle` lifts it."""
        delay_ms = plans.throttle_ms(duration)
        until_ms = self.scripts.run(control.set_throttle_call(self.keys, delay_ms, group))
        return int(until_ms) / 1000

    def unthrottle(self, *, group: str | None = None) -> bool:
        """Lift the queue's (or `group`'s) throttle, supervisors woken at once. False
        when none was in force."""
        return tr.parse_changed(self.scripts.run(control.set_throttle_call(self.keys, 0, group)))

    def throttled(self, *, group: str | None = None) -> float | None:
        """Seconds until the queue's (or `group`'s) throttle ends, None when none is."""
        return self._run(plans.throttled(self.keys, group))

    def set_limits(
        self,
        *,
        rate: tuple[float, float] | None | Literal[False] = False,
        max_in_flight: int | None | Literal[False] = False,
        group_concurrency: int | None | Literal[False] = False,
        group_rate: tuple[float, float] | None | Literal[False] = False,
    ) -> None:
        """Set the queue's global limits, read by every supervisor's next claim.
        rate=(count, period_seconds) or None to remove; max_in_flight=int or None;
        group_concurrency=int (running jobs per group; None: back to the default, 1)
        and group_rate=(count, period_seconds) per group, or None.
        An argument left False is left unchanged."""
        pipe = self.redis.pipeline(transaction=True)
        control.write_limits(pipe, self.keys, rate=rate, max_in_flight=max_in_flight,
                             group_concurrency=group_concurrency, group_rate=group_rate)
        pipe.execute()

    def limits(self) -> dict[str, float]:
        """The queue's numeric settings (rate, max_in_flight, …); `event_settings` has
        on_dead, a task name."""
        limits: dict[str, str] = self.redis.hgetall(self.keys.limits)  # type: ignore[assignment]
        return {name: float(value) for name, value in limits.items() if _number(value)}


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def known_queues(client: redis.Redis) -> list[str]:
    """Every queue a producer has enqueued to, sorted."""
    names: set[str] = client.smembers(keyspace.QUEUES)  # type: ignore[assignment]
    return sorted(names)


def find_job(client: redis.Redis, job_id: str) -> Job:
    """Find a job by id alone, across the known queues (one round trip)."""
    names = known_queues(client)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.exists(keyspace.QueueKeys(name).job(job_id))
    for name, found in zip(names, pipe.execute(), strict=True):
        if found:
            return Queue(name, redis=client).get(job_id)
    raise JobNotFound(f"no job with id {job_id} in any queue ({len(names)} known)")

