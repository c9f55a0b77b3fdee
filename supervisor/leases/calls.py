"""LeaseCalls: what a supervisor sends for the jobs of one queue it leases — claim,
extend, ack, fail, expire, release, reclaim, and the notes a running job leaves.

Each method builds one `ScriptCall` in `forq.store.transitions` and runs it, alone or queued
on a pipeline passed as `client` (then the call returns the pipeline and the reply is
read with the matching ``parse_*``). Producers never need these: `forq.Queue` is the
producer's API, and `leasing(queue)` gives the supervisor (and tests) a queue's lease
calls.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from forq.queue import Queue
from forq.store import control
from forq.store import transitions as tr
from forq.store.policy import fill, flatten, policy_sha
from forq.store.transitions import RECLAIM_BATCH, ClaimResult

_BY_QUEUE: weakref.WeakKeyDictionary[Queue, LeaseCalls] = weakref.WeakKeyDictionary()


def leasing(queue: Queue) -> LeaseCalls:
    """The lease calls of `queue` (one per Queue object: a claim and the parse of its
    reply must meet on the same one)."""
    calls = _BY_QUEUE.get(queue)
    if calls is None:
        calls = _BY_QUEUE[queue] = LeaseCalls(queue)
    return calls


class LeaseCalls:
    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.name = queue.name
        self.keys = queue.keys
        self.redis = queue.redis
        self.scripts = queue.scripts
        self._claim_policy = ""  # the policy JSON of the last claim, for parse_claim

    def claim(self, owner: str, count: int, lease_ttl_ms: int, policy: str = "",
              client: Any = None, code: str | None = None) -> Any:
        """Lease up to `count` jobs to `owner` (see lua/claim.lua); `code`: the handler
        code they will run, kept in each job's record ("" unknown, None: not said). With
        a pipeline as `client`, queues the call (parse the reply with `parse_claim`)."""
        self._claim_policy = policy
        reply = self.scripts.run(
            tr.claim_call(self.keys, owner, count, lease_ttl_ms, policy, code), client)
        return client if client is not None else self.parse_claim(reply)

    def parse_claim(self, reply: Sequence[Any]) -> ClaimResult:
        return tr.parse_claim([*reply[:5], *(self._with_policy(flat) for flat in reply[5:])],
                              self.queue)

    def _with_policy(self, flat: Sequence[str]) -> list[str]:
        """A claimed record with the limits it lacks from its policy (forq.store.policy)."""
        record = dict(zip(flat[::2], flat[1::2], strict=False))
        sha = record.get("policy")
        if not sha:
            return list(flat)
        mine = self._claim_policy and sha == policy_sha(self._claim_policy)
        fill(record, flatten(self._claim_policy) if mine else self.queue._stored_policy(sha))
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

    def ack_many(self, acks: Sequence[tuple[Any, ...]], client: Any = None) -> Any:
        """Ack several jobs in one script call: (job id, token, result JSON, same-queue
        follow-up specs[, the run's cost]) each. Returns "ok"/"lost" per job; with a pipeline, queues the
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
             client: Any = None, delay_ms: int = 0, counted: bool = False,
             pattern: str = "", cost: str = "") -> Any:
        """Count a failed attempt: retry with backoff, or dead (see lua/fail.lua); mode
        "snooze": the handler's own retry after `delay_ms`, an attempt if `counted`.
        `pattern`: how it ended, for its task's circuit breaker; `cost`: the run's
        (lua/includes/cost.lua)."""
        reply = self.scripts.run(tr.fail_call(self.keys, job_id, token, error, mode,
                                              delay_ms=delay_ms, counted=counted,
                                              pattern=pattern, cost=cost), client)
        return client if client is not None else tr.parse_fail(reply)

    parse_fail = staticmethod(tr.parse_fail)

    def throttle(self, job_id: str, token: str, delay_ms: int, group: bool, reason: str,
                 client: Any = None) -> Any:
        """The job's handler throttled its queue (its group): see lua/throttle.lua.
        Returns a `Throttled`; with a pipeline, queues the call (`parse_throttle`)."""
        reply = self.scripts.run(control.throttle_call(self.keys, job_id, token, delay_ms, group,
                                                  reason), client)
        return client if client is not None else control.parse_throttle(reply)

    parse_throttle = staticmethod(control.parse_throttle)

    def expire(self, job_id: str, token: str, reason: str, client: Any = None,
               pattern: str = "", cost: str = "") -> Any:
        """Report a crashed child: the lease expires now ("ok"), or "lost"; `pattern`:
        how it crashed, for its task's circuit breaker; `cost`: the run's."""
        reply = self.scripts.run(tr.expire_call(self.keys, job_id, token, reason, pattern,
                                                cost), client)
        return client if client is not None else tr.parse_lease_reply(reply)

    def set_output(self, job_id: str, token: str, output: str, client: Any = None,
                   trail: str = "") -> Any:
        """Keep the tail of a job's output (and its memory trail, if it did not succeed)
        in its record while `token` holds its lease ("ok"), or "lost"; queued before the
        transition that reports its end."""
        reply = self.scripts.run(tr.output_call(self.keys, job_id, token, output, trail),
                                 client)
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

    def read_parents(self, job_id: str, token: str, first: int, most: int, budget: int,
                     client: Any = None) -> Any:
        """A page of the parents of the job under `token` and their results (see
        lua/parents.lua): a `ParentsPage`; with a pipeline, queues the call
        (`parse_parents`). The supervisor's, for a handler's `current().parents()`."""
        reply = self.scripts.run(control.parents_call(self.keys, job_id, token, first, most, budget),
                                 client)
        return client if client is not None else control.parse_parents(reply)

    parse_parents = staticmethod(control.parse_parents)

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

    def resume_tasks(self, client: Any = None) -> Any:
        """The cool-down pass of the circuit breakers (lua/resume_task.lua): untrip the
        tasks whose cool-down passed, put parked jobs of untripped tasks back. Returns a
        `TaskResumed`; with a pipeline, queues the call."""
        reply = self.scripts.run(control.resume_task_call(self.keys), client)
        return client if client is not None else control.parse_resume_task(reply)

    parse_resume_tasks = staticmethod(control.parse_resume_task)

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
