"""The queue API: what producers call, and the lease transitions the supervisor calls.

Every state change is one Lua script call (see ``lua/``), built and parsed by
`forq.transitions`; this module sends them, alone or batched into pipelines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import redis

from forq import batches, dataformat, plans, topology
from forq import keys as keyspace
from forq import transitions as tr
from forq.batches import Batch
from forq.batchspec import build_batch
from forq.connection import connect
from forq.errors import JobNotFound, QueueFull, refused
from forq.job import Job
from forq.payload import DEFAULT_MAX_PAYLOAD_BYTES, batch_specs, call_spec
from forq.pipelines import run_plan
from forq.policy import fill, flatten, policy_sha
from forq.scripts import Scripts
from forq.transitions import (  # re-exported: the supervisor and tests import them from here
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

RATE_BURST_MS = 10.0  # a rate-limit bucket holds at most this long's worth of tokens


class Queue:
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
        self._claim_policy = ""  # the policy JSON of the last claim, for parse_claim
        self._policies: dict[str, dict[str, str]] = {}  # sha -> stored policy (immutable)

    # -- producing ---------------------------------------------------------------

    def enqueue(self, task: str, *args: Any, **options: Any) -> Job:
        """Enqueue one job; returns a handle whose `id` is the job's (or, for a
        duplicate idempotency `key`, the live job's that already holds the key).

        Options: args=, kwargs= (handler arguments, instead of positional args),
        priority (higher first), delay ("30s") or run_at (datetime / Unix seconds),
        key (idempotency key) and unique_for (keep the key after the job finishes),
        job_id, max_attempts, max_crashes, timeout, memory_limit, result_ttl,
        max_result_bytes, backoff={base, factor, max, jitter}, idempotent, group (a
        key such as "customer-42": at most the queue's group_concurrency jobs of one
        group run at once, 1 unless set, see `set_limits`; other groups keep flowing).
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

    def _run(self, plan: plans.Plan[T]) -> T:
        return run_plan(self.redis, self.scripts, plan)

    # -- inspecting -------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        """The job's current record and history; `JobNotFound` if it does not exist."""
        record, history = self._run(plans.get(self.keys, job_id))
        if record.get("policy"):
            fill(record, self._stored_policy(record["policy"]))
        return Job.from_record(self, record, history)

    def _stored_policy(self, sha: str) -> dict[str, str]:
        """The policy claim stored under `sha` (named by content: cached for good)."""
        if sha not in self._policies:
            flat = self.redis.hgetall(self.keys.policy(sha))
            if not flat:
                return {}
            self._policies[sha] = {str(k): str(v) for k, v in flat.items()}
        return self._policies[sha]

    def stats(self) -> dict[str, Any]:
        """Counts per state, totals, the last minute's outcomes, and the oldest wait."""
        return self._run(plans.stats(self.keys))

    def dead(self, limit: int = 100) -> list[Job]:
        """The oldest dead jobs, with their reasons (two round trips however many)."""
        return [Job.from_record(self, record, history)
                for record, history in self._run(plans.dead(self.keys, limit))]

    # -- operator actions ----------------------------------------------------------

    def cancel(self, job_id: str) -> str:
        """Cancel a job: "cancelled", "cancelling" (active; its supervisor stops it within
        one lease-extension period), "missing", or the terminal state it already had."""
        return tr.parse_cancel(self.scripts.run(tr.cancel_call(self.keys, job_id)))

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

    def resume(self) -> bool:
        """Claim from this queue again; waiting supervisors are woken at once. False when
        it was not paused."""
        return tr.parse_changed(self.scripts.run(tr.resume_call(self.keys)))

    def is_paused(self) -> bool:
        return self._run(plans.paused(self.keys))

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
        if group_concurrency is not None and group_concurrency is not False and (
                not isinstance(group_concurrency, int) or group_concurrency < 1):
            raise ValueError(f"group_concurrency must be an integer >= 1, got {group_concurrency!r}")
        pipe = self.redis.pipeline(transaction=True)
        if rate is None:
            pipe.hdel(self.keys.limits, "rate", "burst")
            pipe.delete(self.keys.bucket)
        elif rate is not False:
            per_ms, burst = _bucket(rate)
            pipe.hset(self.keys.limits, mapping={"rate": repr(per_ms), "burst": repr(burst)})
        if max_in_flight is None:
            pipe.hdel(self.keys.limits, "max_in_flight")
        elif max_in_flight is not False:
            pipe.hset(self.keys.limits, "max_in_flight", int(max_in_flight))
        # a group's place (ready or not) follows from these at its next change: a group
        # held at the old limit is re-placed when one of its jobs ends
        if group_concurrency is None:
            pipe.hdel(self.keys.limits, "group_concurrency")
        elif group_concurrency is not False:
            pipe.hset(self.keys.limits, "group_concurrency", group_concurrency)
        if group_rate is None:
            pipe.hdel(self.keys.limits, "group_rate", "group_burst")
        elif group_rate is not False:
            per_ms, burst = _bucket(group_rate)
            pipe.hset(self.keys.limits, mapping={"group_rate": repr(per_ms),
                                                 "group_burst": repr(burst)})
        pipe.execute()

    def limits(self) -> dict[str, float]:
        limits: dict[str, str] = self.redis.hgetall(self.keys.limits)  # type: ignore[assignment]
        return {k: float(v) for k, v in limits.items()}

    # -- lease transitions (the supervisor's side) --------------------------------

    def claim(self, owner: str, count: int, lease_ttl_ms: int, policy: str = "",
              client: Any = None) -> Any:
        """Lease up to `count` jobs to `owner` (see lua/claim.lua). With a pipeline as
        `client`, queues the call (parse the reply with `parse_claim`)."""
        self._claim_policy = policy
        reply = self.scripts.run(tr.claim_call(self.keys, owner, count, lease_ttl_ms, policy),
                                 client)
        return client if client is not None else self.parse_claim(reply)

    def parse_claim(self, reply: Sequence[Any]) -> ClaimResult:
        return tr.parse_claim([*reply[:5], *(self._with_policy(flat) for flat in reply[5:])],
                              self)

    def _with_policy(self, flat: Sequence[str]) -> list[str]:
        """A claimed record with the limits it lacks from its policy (forq.policy)."""
        record = dict(zip(flat[::2], flat[1::2], strict=False))
        sha = record.get("policy")
        if not sha:
            return list(flat)
        mine = self._claim_policy and sha == policy_sha(self._claim_policy)
        fill(record, flatten(self._claim_policy) if mine else self._stored_policy(sha))
        return [part for pair in record.items() for part in pair]

    def extend(self, leases: Iterable[tuple[str, str]], lease_ttl_ms: int,
               client: Any = None) -> Any:
        """Renew (job id, token) leases. Returns an `ExtendResult` (lost ids, cancelled
        ids, redis ms); with a pipeline as `client`, queues the call and returns it."""
        reply = self.scripts.run(tr.extend_call(self.keys, leases, lease_ttl_ms), client)
        return client if client is not None else tr.parse_extend(reply)

    parse_extend = staticmethod(tr.parse_extend)

    def ack(self, job_id: str, token: str, result_json: str,
            followups: Sequence[Mapping[str, Any]] = (), client: Any = None) -> Any:
        """Mark succeeded with its result ("ok"), or "lost" for a stale token."""
        reply = self.scripts.run(tr.ack_call(self.keys, job_id, token, result_json, followups),
                                 client)
        return client if client is not None else tr.parse_lease_reply(reply)

    def ack_many(self, acks: Sequence[tuple[str, str, str, Sequence[Mapping[str, Any]]]],
                 client: Any = None) -> Any:
        """Ack several jobs in one script call: (job id, token, result JSON, same-queue
        follow-up specs) each. Returns "ok"/"lost" per job; with a pipeline, queues the
        call (`parse_acks` reads its reply)."""
        reply = self.scripts.run(tr.ack_many_call(self.keys, acks), client)
        return client if client is not None else tr.parse_acks(reply)

    parse_acks = staticmethod(tr.parse_acks)

    def open_batch(self, batch_id: str, record: Mapping[str, Any],
                   specs: Sequence[Mapping[str, Any]], opener: str = "", token: str = "",
                   client: Any = None) -> Any:
        """Open a batch on this queue with its members here (see lua/batch.lua); the
        supervisor's, for a batch a handler opened (`opener`, fenced by its `token`).
        Returns a `BatchOpened`; with a pipeline, queues the call."""
        reply = self.scripts.run(tr.batch_call(self.keys, batch_id, record, specs, opener, token),
                                 client)
        return client if client is not None else tr.parse_batch(reply)

    def fail(self, job_id: str, token: str, error: Mapping[str, Any], mode: str = "retry",
             client: Any = None) -> Any:
        """Count a failed attempt: retry with backoff, or dead (see lua/fail.lua)."""
        reply = self.scripts.run(tr.fail_call(self.keys, job_id, token, error, mode), client)
        return client if client is not None else tr.parse_fail(reply)

    parse_fail = staticmethod(tr.parse_fail)

    def expire(self, job_id: str, token: str, reason: str, client: Any = None) -> Any:
        """Report a crashed child: the lease expires now ("ok"), or "lost"."""
        reply = self.scripts.run(tr.expire_call(self.keys, job_id, token, reason), client)
        return client if client is not None else tr.parse_lease_reply(reply)

    def set_output(self, job_id: str, token: str, output: str, client: Any = None) -> Any:
        """Keep the tail of a job's output in its record while `token` holds its lease
        ("ok"), or "lost"; queued before the transition that reports its end."""
        reply = self.scripts.run(tr.output_call(self.keys, job_id, token, output), client)
        return client if client is not None else tr.parse_lease_reply(reply)

    def record_progress(self, entries: Sequence[tuple[str, str, float, str]],
                        client: Any = None) -> Any:
        """Keep running jobs' progress, each (id, token, value, message), in their records
        while each token holds the lease: "ok" or "lost" per job (the supervisor's)."""
        reply = self.scripts.run(tr.progress_call(self.keys, entries), client)
        return client if client is not None else tr.parse_progress(reply)

    def record_step(self, job_id: str, token: str, name: str, result_json: str,
                    client: Any = None) -> Any:
        """Keep a durable step's result in the job while `token` holds its lease ("ok"),
        or "lost": the supervisor's, for a handler's `current().step`."""
        reply = self.scripts.run(tr.step_call(self.keys, job_id, token, name, result_json),
                                 client)
        return client if client is not None else tr.parse_lease_reply(reply)

    def release(self, job_id: str, token: str, reason: str = "drain", client: Any = None) -> Any:
        """Give the lease back with nothing counted ("ok"), or "lost"."""
        reply = self.scripts.run(tr.release_call(self.keys, job_id, token, reason), client)
        return client if client is not None else tr.parse_lease_reply(reply)

    def reclaim(self, reclaimer: str, default_max_crashes: int = 3,
                limit: int = RECLAIM_BATCH, client: Any = None) -> Any:
        """Move expired leases back to pending or to dead. Returns a `ReclaimResult`
        (to pending, to dead, completed, ids); with a pipeline, queues the call."""
        reply = self.scripts.run(tr.reclaim_call(self.keys, reclaimer, default_max_crashes,
                                                 limit), client)
        return client if client is not None else tr.parse_reclaim(reply)

    parse_reclaim = staticmethod(tr.parse_reclaim)

    def sweep_expired(self, sweeper: str, limit: int = tr.SWEEP_BATCH,
                      client: Any = None) -> Any:
        """Move up to `limit` waiting jobs whose expiry before start passed to dead.
        Returns their ids; with a pipeline, queues the call (`parse_sweep`)."""
        reply = self.scripts.run(tr.sweep_expired_call(self.keys, sweeper, limit), client)
        return client if client is not None else tr.parse_sweep(reply)

    parse_sweep = staticmethod(tr.parse_sweep)

    def record_done(self, job_id: str, result_json: str, ttl_ms: int,
                    followups: Sequence[Mapping[str, Any]] = (), client: Any = None) -> Any:
        """Record an idempotent job's completion before its ack, so a lost ack
        leads to "succeeded", not to a second run. Its same-queue `followups` (the specs
        the ack carries) are recorded first, in the same pipeline: a job found succeeded
        through this record gets them enqueued then, so a lost ack never loses them."""
        c = client or self.redis
        ttl = max(1, ttl_ms)
        if followups:
            c.set(self.keys.done_followups(job_id), json.dumps(list(followups)), px=ttl)
        return c.set(self.keys.done(job_id), result_json, px=ttl)


def _bucket(rate: tuple[float, float]) -> tuple[float, float]:
    """(count, period seconds) as a token bucket: (tokens per ms, burst).

    The bucket holds at most RATE_BURST_MS worth of tokens (at least one): any window of
    w ms then starts at most burst + rate * w jobs, so "20/s" never starts more than 21
    in a second (a one-second burst would allow 40), while a high rate still lets a
    supervisor claim a whole batch in one call."""
    count, period = rate
    per_ms = count / (period * 1000.0)
    return per_ms, max(1.0, per_ms * RATE_BURST_MS)


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

