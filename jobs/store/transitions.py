"""Each Lua transition as two pure functions: one builds its call, one parses its reply.

Sans-IO: nothing here touches a socket. The sync `Queue` (alone or in a pipeline), the
`AsyncQueue` and the supervisor all *execute* the same `ScriptCall`s and read replies
with the same parsers, so no transition has a second implementation. The KEYS and ARGV
of every call follow the header of its script in ``lua/``; a parser is the one place
that knows the shape of its script's reply.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, get_args

from forq.job import Job
from forq.store.keys import QueueKeys

if TYPE_CHECKING:
    from forq.queue import Queue

Transition = Literal["enqueue", "claim", "extend", "ack", "fail", "expire", "reclaim",
                     "release", "cancel", "requeue_dead", "purge_dead", "output",
                     "pause", "resume", "sweep_expired",
                     "progress", "step", "batch", "batch_relay",
                     "promote", "reschedule", "set_priority", "find", "resume_task", "trim",
                     "schedule_define", "schedule_fired", "throttle", "set_throttle", "parents"]
TRANSITIONS: tuple[Transition, ...] = get_args(Transition)

ENQUEUE_BATCH = 500  # jobs per script call: long enough to amortise, short enough not to stall Redis
RECLAIM_BATCH = 1000
SWEEP_BATCH = 100  # expired-before-start jobs a reaper pass moves to dead, per queue

FailMode = Literal["retry", "fatal", "cancel", "snooze"]
LeaseReply = Literal["ok", "lost"]  # ack, expire, release, output, progress, step


@dataclass(frozen=True)
class ScriptCall:
    """One script invocation, ready to send: which script, its KEYS and its ARGV."""

    script: Transition
    keys: tuple[str, ...]
    args: tuple[str | int | float, ...]


# -- results ---------------------------------------------------------------------------


@dataclass
class Lease:
    """A job leased to this supervisor: its record and the token that fences it."""

    job: Job
    token: str

    @property
    def id(self) -> str:
        return self.job.id


@dataclass
class ClaimResult:
    leases: list[Lease]
    next_due_ms: int  # earliest scheduled run-at (Redis ms), -1 if none
    rate_wait_ms: int  # >0: the rate limit held jobs back this long
    pending_left: int
    held_by_max_in_flight: bool
    now_ms: int  # Redis time of the claim


@dataclass
class FailOutcome:
    outcome: str  # "retry" | "snoozed" | "dead" | "cancelled" | "lost"
    run_at_ms: int
    attempts: int


class Enqueued(NamedTuple):
    id: str  # the new job's, or for a duplicate or a replace the job's that holds the key
    status: str  # "pending" | "scheduled" | "waiting" | "dead" | "duplicate" | "replaced"


class ExtendResult(NamedTuple):
    lost: list[str]  # leases no longer held: kill the child, drop its result
    cancelled: list[str]  # still held, but `cancel` was asked for
    now_ms: int


class ReclaimResult(NamedTuple):
    to_pending: int
    to_dead: int
    completed: int  # idempotent jobs found done: marked succeeded, not run again
    ids: list[str]  # every job moved (cancelled ones too, in none of the counts)


class DeadBatchResult(NamedTuple):
    done: int  # how many were requeued or purged
    not_dead: list[str]  # ids given that were not in the dead set


# -- producing -------------------------------------------------------------------------


_POSITIONAL = frozenset(("id", "task", "args", "kwargs", "priority"))  # lua/enqueue.lua


def enqueue_calls(keys: QueueKeys, specs: Sequence[Mapping[str, Any]]) -> list[ScriptCall]:
    """Validated specs (`forq.payload.build_spec`) in calls of `ENQUEUE_BATCH` jobs, six
    arguments a job: id, task, args, kwargs, priority, and its other fields as one JSON
    object, or "" when it has none (a plain job: the script's short path)."""
    return list(iter_enqueue_calls(keys, specs))


def iter_enqueue_calls(keys: QueueKeys, specs: Sequence[Mapping[str, Any]]) -> Iterator[ScriptCall]:
    """`enqueue_calls`, each built when asked for (one is sent while Redis runs the last)."""
    for start in range(0, len(specs), ENQUEUE_BATCH):
        args: list[str] = [keys.prefix, keys.queue]
        for s in specs[start:start + ENQUEUE_BATCH]:
            rest = "" if len(s) <= 5 and _POSITIONAL.issuperset(s) else json.dumps(
                {k: v for k, v in s.items() if k not in _POSITIONAL}, separators=(",", ":"))
            args += (s["id"], s["task"], s.get("args", "[]"), s.get("kwargs", "{}"),
                     str(s.get("priority", 0)), rest)
        yield ScriptCall("enqueue", (keys.pending, keys.scheduled), tuple(args))


def parse_enqueue(reply: Sequence[Any], ids: Sequence[str]) -> list[Enqueued]:
    """Each job's outcome, for a call of jobs sent under `ids`: the reply lists those not
    pending under their own id, four entries each (place from 1, id, status, run_at)."""
    out = [Enqueued(job_id, "pending") for job_id in ids]
    for i in range(0, len(reply), 4):
        out[int(reply[i]) - 1] = Enqueued(str(reply[i + 1]), str(reply[i + 2]))
    return out


# -- operator actions ------------------------------------------------------------------


def cancel_call(keys: QueueKeys, job_id: str, only_if: str = "") -> ScriptCall:
    """Cancel a job; with `only_if` (a state), only when it is in that state."""
    return ScriptCall("cancel", (keys.pending, keys.scheduled), (keys.prefix, job_id, only_if))


def parse_cancel(reply: Any) -> str:
    """"cancelled", "cancelling", "missing", or the terminal state it already had (with
    `only_if`: the state it was in, when another)."""
    return str(reply)


def _dead_selection(ids: Sequence[str] | None, limit: int) -> tuple[str | int, ...]:
    return ("all", limit) if ids is None else ("ids", *ids)


def requeue_dead_call(keys: QueueKeys, ids: Sequence[str] | None, limit: int) -> ScriptCall:
    return ScriptCall("requeue_dead", (keys.dead, keys.pending),
                      (keys.prefix, *_dead_selection(ids, limit)))


def purge_dead_call(keys: QueueKeys, ids: Sequence[str] | None, limit: int) -> ScriptCall:
    return ScriptCall("purge_dead", (keys.dead,), (keys.prefix, *_dead_selection(ids, limit)))


def parse_dead_batch(reply: Sequence[Any]) -> DeadBatchResult:
    return DeadBatchResult(int(reply[0]), [str(i) for i in reply[1:]])


class Changed(NamedTuple):
    """promote, reschedule and set_priority: what the script answered."""

    outcome: str  # "promoted" | "rescheduled" | "changed" | "refused" | "missing"
    state: str  # the job's state now ("" when missing); when refused, the state that refused
    why: str = ""  # reschedule refused: "state" or "expires"
    run_at_ms: int = 0  # reschedule: the job's run-at now


def promote_call(keys: QueueKeys, job_id: str) -> ScriptCall:
    """Run a scheduled job now (scheduled -> pending)."""
    return ScriptCall("promote", (keys.scheduled, keys.pending), (keys.prefix, job_id))


def reschedule_call(keys: QueueKeys, job_id: str, ms: int, relative: bool = False) -> ScriptCall:
    """A pending or scheduled job's new run-at: Unix ms, or (`relative`) ms from now by
    Redis's clock."""
    return ScriptCall("reschedule", (keys.scheduled, keys.pending),
                      (keys.prefix, job_id, int(ms), "in" if relative else "at"))


def set_priority_call(keys: QueueKeys, job_id: str, priority: int) -> ScriptCall:
    """A pending, scheduled or waiting job's new priority (a pending one moves at once)."""
    return ScriptCall("set_priority", (keys.pending,), (keys.prefix, job_id, int(priority)))


def parse_changed_job(reply: Sequence[Any]) -> Changed:
    """{outcome, state[, why | run_at]} from promote, reschedule or set_priority."""
    outcome, state = str(reply[0]), str(reply[1])
    if outcome == "refused":
        return Changed(outcome, state, str(reply[2]) if len(reply) > 2 else "state")
    run_at = int(reply[2]) if outcome == "rescheduled" and len(reply) > 2 else 0
    return Changed(outcome, state, "", run_at)


def pause_call(keys: QueueKeys) -> ScriptCall:
    """Stop every supervisor claiming from the queue (running jobs keep their leases)."""
    return ScriptCall("pause", (keys.limits,), (keys.prefix,))


def resume_call(keys: QueueKeys) -> ScriptCall:
    """Let supervisors claim again, woken at once over the queue's wake channel."""
    return ScriptCall("resume", (keys.limits,), (keys.prefix,))


def parse_changed(reply: Any) -> bool:
    """pause and resume: True when the call changed the queue, False when it already
    was paused (pause) or was not paused (resume)."""
    return int(reply) == 1


# -- lease transitions (the supervisor's side) -------------------------------------------


def claim_call(keys: QueueKeys, owner: str, count: int, lease_ttl_ms: int,
               policy: str = "", code: str | None = None) -> ScriptCall:
    args: tuple[Any, ...] = (keys.prefix, owner, count, lease_ttl_ms, policy)
    return ScriptCall("claim",
                      (keys.pending, keys.scheduled, keys.active, keys.limits, keys.bucket),
                      args if code is None else (*args, code))


def parse_claim(reply: Sequence[Any], queue: Queue | None = None) -> ClaimResult:
    """The leased jobs (each a `Job` bound to `queue`) and the claim's hints."""
    leases = []
    for flat in reply[5:]:
        record = dict(zip(flat[::2], flat[1::2], strict=False))
        leases.append(Lease(Job.from_record(queue, record, []), record["token"]))
    return ClaimResult(leases, int(reply[0]), int(reply[1]), int(reply[2]),
                       bool(reply[3]), int(reply[4]))


def extend_call(keys: QueueKeys, leases: Iterable[tuple[str, str]],
                lease_ttl_ms: int) -> ScriptCall:
    pairs = [part for lease in leases for part in lease]
    return ScriptCall("extend", (keys.active,), (keys.prefix, lease_ttl_ms, *pairs))


def parse_extend(reply: Sequence[Any]) -> ExtendResult:
    return ExtendResult(list(reply[0]), list(reply[1]), int(reply[2]))


def ack_call(keys: QueueKeys, job_id: str, token: str, result_json: str,
             followups: Sequence[Mapping[str, Any]] = ()) -> ScriptCall:
    return ack_many_call(keys, [(job_id, token, result_json, followups)])


def ack_many_call(keys: QueueKeys, acks: Sequence[tuple[Any, ...]]) -> ScriptCall:
    """One ack call for several jobs of a queue: (job id, token, result JSON, same-queue
    follow-up specs[, the run's cost]) each; the script answers per job (`parse_acks`)."""
    args: list[str | int] = [keys.prefix, keys.queue]
    for job_id, token, result_json, followups, *cost in acks:
        args += [job_id, token, result_json, cost[0] if cost else "", len(followups),
                 *(json.dumps(f) for f in followups)]
    return ScriptCall("ack", (keys.active, keys.pending, keys.scheduled), tuple(args))


def parse_acks(reply: Any) -> list[LeaseReply]:
    """ack's answer per job: a call for one job answers a string, for several a list."""
    return [parse_lease_reply(r) for r in ([reply] if isinstance(reply, str) else reply)]


def parse_lease_reply(reply: Any) -> LeaseReply:
    """ack, expire and release answer "ok", or "lost" for a stale token."""
    if reply == "ok":
        return "ok"
    if reply == "lost":
        return "lost"
    raise ValueError(f"expected 'ok' or 'lost' from a lease transition, got {reply!r}")


def fail_call(keys: QueueKeys, job_id: str, token: str, error: Mapping[str, Any],
              mode: FailMode | str = "retry", jitter: float | None = None,
              delay_ms: int = 0, counted: bool = False, pattern: str = "",
              cost: str = "") -> ScriptCall:
    """`jitter`, a uniform draw from [0, 1), is passed in so the script stays
    deterministic (Redis replicates scripts by effect, but tests like a fixed draw).
    `delay_ms` and `counted`: a snooze's (mode "snooze", the handler's `Retry`); `pattern`:
    how the job ended, for its task's circuit breaker ("" counts none); `cost`: the run's."""
    draw = random.random() if jitter is None else jitter
    return ScriptCall("fail", (keys.active, keys.scheduled, keys.dead),
                      (keys.prefix, job_id, token, json.dumps(error), mode, draw,
                       int(delay_ms), "1" if counted else "0", pattern, cost))


def parse_fail(reply: Sequence[Any]) -> FailOutcome:
    return FailOutcome(str(reply[0]), int(reply[1]), int(reply[2]))


def expire_call(keys: QueueKeys, job_id: str, token: str, reason: str, pattern: str = "",
                cost: str = "") -> ScriptCall:
    return ScriptCall("expire", (keys.active,),
                      (keys.prefix, job_id, token, reason, pattern, cost))


def release_call(keys: QueueKeys, job_id: str, token: str, reason: str = "drain") -> ScriptCall:
    return ScriptCall("release", (keys.active, keys.pending), (keys.prefix, job_id, token, reason))


def output_call(keys: QueueKeys, job_id: str, token: str, output: str,
                trail: str = "") -> ScriptCall:
    """Not a state change: the tail of a finished child's output, and the memory
    samples of its last seconds (JSON; "" for none), kept in its record while the lease
    is held (sent just before the transition that reports its end)."""
    return ScriptCall("output", (keys.active,), (keys.prefix, job_id, token, output, trail))


def progress_call(keys: QueueKeys,
                  entries: Iterable[tuple[str, str, float, str]]) -> ScriptCall:
    """Not a state change: the latest progress of running jobs of this queue, each
    (job id, token, value 0..1, message), kept in their records while the lease is held
    (sent with the lease extension)."""
    args: list[str | int | float] = [keys.prefix]
    for job_id, token, value, message in entries:
        args += [job_id, token, repr(float(value)), message]
    return ScriptCall("progress", (keys.active,), tuple(args))


def parse_progress(reply: Sequence[Any]) -> list[LeaseReply]:
    """progress's answer per job, in the order sent."""
    return [parse_lease_reply(r) for r in reply]


def step_call(keys: QueueKeys, job_id: str, token: str, name: str,
              result_json: str) -> ScriptCall:
    """Not a state change: a durable step's result (checked, compact JSON) kept in the
    job's record under the lease; answered with `parse_lease_reply`."""
    return ScriptCall("step", (keys.active,), (keys.prefix, job_id, token, name, result_json))


def reclaim_call(keys: QueueKeys, reclaimer: str, default_max_crashes: int = 3,
                 limit: int = RECLAIM_BATCH) -> ScriptCall:
    return ScriptCall("reclaim", (keys.active, keys.pending, keys.dead),
                      (keys.prefix, default_max_crashes, limit, reclaimer))


def sweep_expired_call(keys: QueueKeys, sweeper: str, limit: int = SWEEP_BATCH) -> ScriptCall:
    return ScriptCall("sweep_expired", (keys.expiring, keys.pending, keys.scheduled, keys.dead),
                      (keys.prefix, limit, sweeper))


def parse_sweep(reply: Sequence[Any]) -> list[str]:
    """The ids of the jobs the sweep moved to dead (expired before start)."""
    return [str(i) for i in reply[1:]]


def parse_reclaim(reply: Sequence[Any]) -> ReclaimResult:
    return ReclaimResult(int(reply[0]), int(reply[1]), int(reply[2]),
                         [str(i) for i in reply[3:]])


# -- batches (fan-out / fan-in) ----------------------------------------------------------


class BatchOpened(NamedTuple):
    status: str  # "opened" | "exists" (opened before: nothing changed) | "lost" (stale opener)
    enqueued: int  # member jobs added in the batch's own queue


def batch_call(keys: QueueKeys, batch_id: str, record: Mapping[str, Any],
               specs: Sequence[Mapping[str, Any]], opener: str = "",
               token: str = "") -> ScriptCall:
    """Open batch `batch_id` on this queue (`record`: total, on_success, on_complete,
    members) with its members of this queue; `opener`/`token`: the running job that
    opens it from its handler (fenced by its lease), empty for a producer."""
    return ScriptCall("batch", (keys.pending, keys.scheduled),
                      (keys.prefix, keys.queue, batch_id, json.dumps(record), opener, token,
                       *(json.dumps(s) for s in specs)))


def parse_batch(reply: Sequence[Any]) -> BatchOpened:
    return BatchOpened(str(reply[0]), int(reply[1]))


def batch_relay_call(keys: QueueKeys, ends: Iterable[tuple[str, str, bool]]) -> ScriptCall:
    """Deliver (batch id, member id, succeeded) ends to batches that live on this queue."""
    args: list[str] = [keys.prefix]
    for batch_id, member, ok in ends:
        args += [batch_id, member, "1" if ok else "0"]
    return ScriptCall("batch_relay", (keys.pending,), tuple(args))


def parse_batch_relay(reply: Any) -> int:
    """How many ends were counted (the rest had been delivered before)."""
    return int(reply)
