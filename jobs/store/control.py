"""A handler's own transitions as calls (sans-IO, as `forq.store.transitions`): its
throttle of its queue or group (lua/throttle.lua) and an operator's (set_throttle.lua),
and the read of its parents' results (parents.lua); an operator's resume of a task its
circuit breaker tripped (resume_task.lua). A snooze is a mode of `fail_call`.

And retention (trim.lua): a job that ends succeeded or dead enters its queue's retention
index (lua/includes/retain.lua), the zset ``kept:<state>:<count>`` of the jobs sharing
that keep count, scored by the time their keep age runs out, listed in the set ``kept``.
The reaper's pass (`trim_call`) deletes what is past its age or beyond its count, a
bounded number per call; `forq purge` sends chosen ids the same way (`purge_call`), so
both keep every live job and every record a waiting job still needs.

And an operator's limits of a queue (`Queue.set_limits`): the writes, on a transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal, NamedTuple

from forq.store.keys import QueueKeys
from forq.store.transitions import ScriptCall


class Throttled(NamedTuple):
    """throttle.lua's answer."""

    # "throttled" | "dead" (past max_snoozes) | "cancelled" (its cancel had been asked) |
    # "lost"
    outcome: str
    until_ms: int  # the end of the throttle in force (Redis ms), 0 when none was set


def throttle_call(keys: QueueKeys, job_id: str, token: str, delay_ms: int, group: bool,
                  reason: str) -> ScriptCall:
    """The handler of the job under `token` throttled its queue (`group`: its group) for
    `delay_ms` (capped by the supervisor); the job goes back to pending."""
    return ScriptCall("throttle", (keys.active, keys.limits, keys.dead),
                      (keys.prefix, job_id, token, int(delay_ms),
                       "group" if group else "queue", reason))


def parse_throttle(reply: Sequence[Any]) -> Throttled:
    return Throttled(str(reply[0]), int(reply[1]))


def set_throttle_call(keys: QueueKeys, delay_ms: int, group: str | None = None) -> ScriptCall:
    """Throttle the queue (or `group`) for `delay_ms` from Redis's now; 0 lifts it."""
    return ScriptCall("set_throttle", (keys.limits,), (keys.prefix, int(delay_ms), group or ""))


class TaskResumed(NamedTuple):
    """resume_task.lua's answer."""

    untripped: int  # tasks this call untripped
    moved: int  # parked jobs put back in pending
    left: int  # parked jobs of untripped tasks still to put back (the next call)
    tripped: dict[str, str]  # the tasks still tripped: task -> its reason (JSON)


RESUME_BATCH = 1000  # parked jobs put back per call


def resume_task_call(keys: QueueKeys, task: str = "", most: int = RESUME_BATCH) -> ScriptCall:
    """Untrip `task`'s circuit breaker and put its parked jobs back (at most `most` a
    call); `task` "": the reaper's pass, every task whose cool-down has passed."""
    return ScriptCall("resume_task", (keys.tripped, keys.limits), (keys.prefix, task, int(most)))


def parse_resume_task(reply: Sequence[Any]) -> TaskResumed:
    flat = list(reply[3]) if len(reply) > 3 else []
    return TaskResumed(int(reply[0]), int(reply[1]), int(reply[2]),
                       dict(zip(flat[::2], flat[1::2], strict=True)))


class ParentsPage(NamedTuple):
    """A page of a running job's parents (lua/parents.lua)."""

    status: str  # "ok", "lost" (stale token) or "expired" (a callback's batch is gone)
    total: int
    next: int  # the index of the next page's first parent, -1 after the last page
    # per parent [queue, id, state, result JSON, reason]; [queue, id] alone for one on
    # another queue (read apart); state "" when its record is gone
    entries: list[list[str]]


def parents_call(keys: QueueKeys, job_id: str, token: str, first: int, most: int,
                 budget: int) -> ScriptCall:
    """A page of the parents of the job under `token`: from parent `first`, at most
    `most` of them and `budget` bytes of results and reasons (at least one parent)."""
    return ScriptCall("parents", (keys.active,), (keys.prefix, job_id, token, first, most,
                                                  budget))


def parse_parents(reply: Sequence[Any]) -> ParentsPage:
    if reply and reply[0] in ("lost", "expired"):
        return ParentsPage(str(reply[0]), 0, -1, [])
    return ParentsPage("ok", int(reply[0]), int(reply[1]),
                       [[str(part) for part in entry] for entry in reply[2:]])


# -- retention ----------------------------------------------------------------------------

TRIM_BATCH = 1000  # index entries a reaper pass looks at, per queue (O(log n) each)
KEPT_STATES = ("succeeded", "dead")


class TrimResult(NamedTuple):
    succeeded: int  # succeeded records deleted
    dead: int  # dead records deleted
    kept_back: int  # past their window, but still needed (idempotency key, depends_on)
    more: bool  # the budget ran out: more may be due


def trim_call(keys: QueueKeys, limit: int = TRIM_BATCH) -> ScriptCall:
    """The reaper's pass over one queue's retention index."""
    return ScriptCall("trim", (keys.kept, keys.dead), (keys.prefix, "pass", limit))


def purge_call(keys: QueueKeys, targets: Iterable[tuple[str, str]]) -> ScriptCall:
    """Delete the ended jobs `targets` ((state, id) pairs) now, as a trim would: a job
    no longer in that state, or still needed, stays."""
    return ScriptCall("trim", (keys.kept, keys.dead),
                      (keys.prefix, "ids", 0, *(f"{state}:{jid}" for state, jid in targets)))


def parse_trim(reply: Sequence[Any]) -> TrimResult:
    return TrimResult(int(reply[0]), int(reply[1]), int(reply[2]), bool(int(reply[3])))


def bucket_state(bucket: str) -> str:
    """"succeeded" for the bucket "succeeded:10000"."""
    return bucket.partition(":")[0]


def retained_counts(client: Any, keys: QueueKeys) -> dict[str, int]:
    """How many succeeded and dead records the queue's retention index holds now (two
    round trips; a few buckets per queue)."""
    buckets = sorted(str(b) for b in client.smembers(keys.kept))
    pipe = client.pipeline(transaction=False)
    for bucket in buckets:
        pipe.zcard(keys.kept_bucket(bucket))
    counts = dict.fromkeys(KEPT_STATES, 0)
    for bucket, n in zip(buckets, pipe.execute() if buckets else [], strict=True):
        state = bucket_state(bucket)
        if state in counts:
            counts[state] += int(n)
    return counts


RATE_BURST_MS = 10.0  # a rate-limit bucket holds at most this long's worth of tokens


def token_bucket(rate: tuple[float, float]) -> tuple[float, float]:
    """(count, period seconds) as a token bucket: (tokens per ms, burst).

    The bucket holds at most RATE_BURST_MS worth of tokens (at least one): any window of
    w ms then starts at most burst + rate * w jobs, so "20/s" never starts more than 21
    in a second (a one-second burst would allow 40), while a high rate still lets a
    supervisor claim a whole batch in one call."""
    count, period = rate
    per_ms = count / (period * 1000.0)
    return per_ms, max(1.0, per_ms * RATE_BURST_MS)


def write_limits(pipe: Any, keys: QueueKeys, *,
                 rate: tuple[float, float] | None | Literal[False] = False,
                 max_in_flight: int | None | Literal[False] = False,
                 group_concurrency: int | None | Literal[False] = False,
                 group_rate: tuple[float, float] | None | Literal[False] = False) -> None:
    """Queue the writes of `Queue.set_limits` on `pipe` (False: left unchanged, None:
    removed); a bad group_concurrency is a ValueError before anything is queued."""
    if group_concurrency is not None and group_concurrency is not False and (
            not isinstance(group_concurrency, int) or group_concurrency < 1):
        raise ValueError(f"group_concurrency must be an integer >= 1, got {group_concurrency!r}")
    if rate is None:
        pipe.hdel(keys.limits, "rate", "burst")
        pipe.delete(keys.bucket)
    elif rate is not False:
        per_ms, burst = token_bucket(rate)
        pipe.hset(keys.limits, mapping={"rate": repr(per_ms), "burst": repr(burst)})
    if max_in_flight is None:
        pipe.hdel(keys.limits, "max_in_flight")
    elif max_in_flight is not False:
        pipe.hset(keys.limits, "max_in_flight", int(max_in_flight))
    # a group's place (ready or not) follows from these at its next change: a group
    # held at the old limit is re-placed when one of its jobs ends
    if group_concurrency is None:
        pipe.hdel(keys.limits, "group_concurrency")
    elif group_concurrency is not False:
        pipe.hset(keys.limits, "group_concurrency", group_concurrency)
    if group_rate is None:
        pipe.hdel(keys.limits, "group_rate", "group_burst")
    elif group_rate is not False:
        per_ms, burst = token_bucket(group_rate)
        pipe.hset(keys.limits, mapping={"group_rate": repr(per_ms), "group_burst": repr(burst)})
