"""The producer's operations as plans: what to send, and what the replies mean.

A plan is a generator: it yields a batch of commands (sent as one round trip), gets
their replies back, and returns its result — so `Queue` and `AsyncQueue` run the very
same plans, each with its own I/O (`forq.store.pipelines.run_plan` and its awaiting twin).
A command is a `ScriptCall` (a transition, see `forq.store.transitions`), a `WaitReplicas`,
or a plain Redis command as a tuple (``("HGETALL", key)``).
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from forq.channel import MAX_THROTTLE_MS
from forq.errors import JobNotFound, JobStateError, PayloadError
from forq.store import control, topology
from forq.store import keys as keyspace
from forq.store import transitions as tr
from forq.store.keys import QueueKeys
from forq.units import UnitError, parse_duration

T = TypeVar("T")


@dataclass(frozen=True)
class WaitReplicas:
    """``WAIT replicas timeout_ms`` after the writes to `keys` (one per cluster node);
    its reply is the list of the WAIT replies."""

    replicas: int
    timeout_ms: int
    keys: tuple[str, ...]


Command = tr.ScriptCall | WaitReplicas | tuple[Any, ...]
Plan = Generator[list[Command], list[Any], T]
Record = tuple[dict[str, str], list[str]]  # a job's hash and its history entries

LAST_MINUTE = ("succeeded", "failed", "dead", "crashed", "retried")


def enqueue(keys: QueueKeys, specs: Sequence[Mapping[str, Any]], *, register: bool,
            replicas: int = 0, wait_ms: int = 0) -> Plan[list[tr.Enqueued]]:
    """Enqueue validated specs; `register` adds the queue to the known queues first.
    With `replicas`, raise `NotReplicated` naming the jobs when WAIT came back short."""
    calls = tr.enqueue_calls(keys, specs)
    commands: list[Command] = [("SADD", keyspace.QUEUES, keys.queue)] if register else []
    first = len(commands)
    commands += calls
    if replicas:
        commands.append(WaitReplicas(replicas, wait_ms, (keys.pending,)))
    replies = yield commands
    enqueued = [job for start, reply in zip(range(0, len(specs), tr.ENQUEUE_BATCH),
                                            replies[first:first + len(calls)], strict=True)
                for job in tr.parse_enqueue(reply, [spec["id"] for spec in
                                                    specs[start:start + tr.ENQUEUE_BATCH]])]
    if replicas:
        topology.check_wait(replies[-1], replicas, wait_ms, [job.id for job in enqueued])
    return enqueued


def get(keys: QueueKeys, job_id: str) -> Plan[Record]:
    """The job's record and history; `JobNotFound` if it does not exist."""
    record, history = yield [("HGETALL", keys.job(job_id)), ("LRANGE", keys.history(job_id), 0, -1)]
    if not record:
        raise JobNotFound(f"no job {job_id} in queue {keys.queue}")
    return record, history


def dead(keys: QueueKeys, limit: int) -> Plan[list[Record]]:
    """The oldest dead jobs' records (two round trips however many)."""
    (ids,) = yield [("ZRANGE", keys.dead, 0, limit - 1)]
    if not ids:
        return []
    replies = yield [command for job_id in ids
                     for command in (("HGETALL", keys.job(job_id)),
                                     ("LRANGE", keys.history(job_id), 0, -1))]
    return [(record, history)
            for record, history in zip(replies[::2], replies[1::2], strict=True) if record]


def stats(keys: QueueKeys) -> Plan[dict[str, Any]]:
    """Counts per state, totals, the last minute's outcomes, and the oldest wait."""
    (pending, scheduled, active, dead_count, totals, now, head, grouped, (paused_at, throttled_until),
     waiting, tripped, parked_tasks, buckets) = yield [
        ("ZCARD", keys.pending), ("ZCARD", keys.scheduled), ("ZCARD", keys.active),
        ("ZCARD", keys.dead), ("HGETALL", keys.stats), ("TIME",),
        ("ZRANGE", keys.pending, 0, 0), ("GET", keys.groups_pending),
        ("HMGET", keys.limits, "paused", "throttled_until"), ("ZCARD", keys.waiting),
        ("HGETALL", keys.tripped), ("SMEMBERS", keys.parked_tasks), ("SMEMBERS", keys.kept)]
    pending += int(grouped or 0)  # grouped jobs wait in their groups' sets
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    minute = now_ms // 60000
    parked_names = sorted(set(tripped) | set(parked_tasks))
    reads: list[Command] = [("ZCARD", keys.parked(task)) for task in parked_names]
    reads += [("HGETALL", keys.minute(minute)), ("HGETALL", keys.minute(minute - 1))]
    if head:
        reads.append(("HMGET", keys.job(head[0]), "enqueued_at", "run_at"))
    replies = yield reads
    parked = dict(zip(parked_names, replies[:len(parked_names)], strict=True))
    replies = replies[len(parked_names):]
    # the current minute so far plus the previous one, weighted: a sliding minute
    frac = (now_ms % 60000) / 60000
    last_minute = {name: round(int(replies[0].get(name, 0))
                               + int(replies[1].get(name, 0)) * (1 - frac))
                   for name in LAST_MINUTE}
    oldest = None
    if head and replies[2][0]:
        since = max(int(replies[2][0]), int(replies[2][1] or 0))
        oldest = max(0.0, (now_ms - since) / 1000)
    parked_total = sum(parked.values())
    kept = yield from retained(keys, sorted(str(b) for b in buckets or ()), int(dead_count))
    return {
        "pending": pending + parked_total,  # parked jobs are pending too (below)
        "scheduled": scheduled,
        "active": active,
        "dead": dead_count,
        "waiting": waiting,  # on their dependencies (depends_on)
        "succeeded": int(totals.get("succeeded", 0)),
        "failed": int(totals.get("failed", 0)),
        "totals": {k: int(v) for k, v in totals.items()},
        "last_minute": last_minute,
        "oldest_pending_age": oldest,
        "paused": paused_at is not None,
        # seconds until a throttle of the whole queue ends (`current().throttle`), or None
        "throttled_for": _left(throttled_until, now_ms),
        # tasks their circuit breaker tripped: {task: {pattern, jobs, ..., parked}}, and
        # the pending jobs parked (not claimable until their task resumes)
        "tripped": {task: trip_reason(raw, parked.get(task, 0), now_ms)
                    for task, raw in tripped.items()},
        "parked": parked_total,
        # ended records kept (docs/operations/retention.md): count and estimated bytes
        "retained": kept,
    }


def trip_reason(raw: str, parked: int, now_ms: int) -> dict[str, Any]:
    """A tripped task's reason as resume_task.lua's header names it, with its parked
    jobs and the seconds left of its cool-down (None: until `forq resume --task`)."""
    try:
        reason = json.loads(raw)
    except ValueError:
        reason = None
    if not isinstance(reason, dict):
        reason = {"pattern": "?"}
    until = int(reason.get("until") or 0)
    return {**reason, "parked": int(parked),
            "resumes_in": _left(str(until), now_ms) if until else None}


RETAINED_SAMPLE = 3  # records per state whose MEMORY USAGE estimates the rest


def retained(keys: QueueKeys, buckets: list[str], dead: int) -> Plan[dict[str, Any]]:
    """The succeeded and dead records a queue keeps: how many, and their bytes, estimated
    from `MEMORY USAGE` of the newest few (record and history) times the count, plus
    the index sets' own. Two round trips, whatever the counts."""
    sets = [(bucket.partition(":")[0], keys.kept_bucket(bucket)) for bucket in buckets]
    sets.append(("dead", keys.dead))
    replies = yield [cmd for _, zset in sets
                     for cmd in (("ZCARD", zset), ("ZRANGE", zset, -RETAINED_SAMPLE, -1))]
    counts = {"succeeded": 0, "dead": dead}
    sampled: dict[str, list[str]] = {"succeeded": [], "dead": []}
    for i, (state, _zset) in enumerate(sets):
        if state == "succeeded":
            counts[state] += int(replies[2 * i])
        if state in sampled and len(sampled[state]) < RETAINED_SAMPLE:
            sampled[state] += list(replies[2 * i + 1])[:RETAINED_SAMPLE - len(sampled[state])]
    reads: list[Command] = [("MEMORY", "USAGE", zset) for _, zset in sets]
    order = [(state, jid) for state in sampled for jid in sampled[state]]
    reads += [("MEMORY", "USAGE", key) for _, jid in order
              for key in (keys.job(jid), keys.history(jid))]
    usage = yield reads
    out = {state: {"count": counts[state], "bytes": 0} for state in counts}
    for (state, _zset), used in zip(sets, usage, strict=False):
        if state in out:
            out[state]["bytes"] += int(used or 0)
    records = usage[len(sets):]
    for state in out:
        mine = [int(records[2 * k] or 0) + int(records[2 * k + 1] or 0)
                for k, (s, _) in enumerate(order) if s == state]
        if mine:
            out[state]["bytes"] += round(sum(mine) / len(mine) * counts[state])
    return out


def _left(until_ms: str | None, now_ms: int) -> float | None:
    """Seconds from `now_ms` to `until_ms` (Redis ms), None when that is not ahead."""
    if until_ms is None or int(until_ms) <= now_ms:
        return None
    return (int(until_ms) - now_ms) / 1000


def throttle_ms(duration: Any) -> int:
    """An operator's throttle (`Queue.throttle`) as ms, from 1 ms to 24 h, or a
    ValueError naming it."""
    try:
        ms = int(round(parse_duration(duration, where="throttle") * 1000))
    except UnitError as exc:
        raise ValueError(str(exc)) from None
    if not 0 < ms <= MAX_THROTTLE_MS:
        raise ValueError(f"throttle: expected a duration from 1ms to 24h, got {duration!r}")
    return ms


def throttled(keys: QueueKeys, group: str | None = None) -> Plan[float | None]:
    """Seconds until the throttle of the queue (or of `group`) ends; None when none is
    in force."""
    read: Command = (("GET", keys.group_throttle(group)) if group is not None
                     else ("HGET", keys.limits, "throttled_until"))
    until_ms, now = yield [read, ("TIME",)]
    return _left(until_ms, int(now[0]) * 1000 + int(now[1]) // 1000)


def paused(keys: QueueKeys) -> Plan[bool]:
    """Whether the queue is paused (`pause`): no supervisor claims from it."""
    (found,) = yield [("HEXISTS", keys.limits, "paused")]
    return bool(found)


def resume_task(keys: QueueKeys, task: str) -> Plan[bool]:
    """Untrip `task`'s circuit breaker and put back all its parked jobs, a batch a call
    (lua/resume_task.lua). True when it was tripped."""
    (reply,) = yield [control.resume_task_call(keys, task)]
    done = control.parse_resume_task(reply)
    left, moved = done.left, done.moved
    while left and moved:  # the parked jobs beyond the first call's batch
        (reply,) = yield [control.resume_task_call(keys, task)]
        again = control.parse_resume_task(reply)
        left, moved = again.left, again.moved
    return done.untripped > 0


def script(call: tr.ScriptCall) -> Plan[Any]:
    """One transition alone: its raw reply (the caller parses it)."""
    (reply,) = yield [call]
    return reply


# -- changing a job that has not run yet (promote, reschedule, set_priority) -------------


def new_run_at(at: Any = None, delay: Any = None) -> tuple[int, bool]:
    """`reschedule`'s time: `at` (a datetime or Unix seconds) as Unix ms, or `delay` (a
    duration: "30s", seconds) as ms from now by Redis's clock; (ms, relative)."""
    if (at is None) == (delay is None):
        raise PayloadError("give the new time as at= (a datetime or Unix seconds) or "
                           "delay= (a duration such as \"30s\"), one of them")
    if delay is not None:
        if isinstance(delay, bool):
            raise PayloadError(f"delay must be a duration, got {delay!r}")
        return max(0, _delay_ms(delay)), True
    when = at.timestamp() if hasattr(at, "timestamp") else at
    if not isinstance(when, (int, float)) or isinstance(when, bool) or not 0 <= when < 2 ** 43 / 1000:
        raise PayloadError(f"at must be a datetime or Unix seconds, got {at!r}"[:300])
    return int(when * 1000), False


def _delay_ms(delay: Any) -> int:
    try:
        return int(round(parse_duration(delay, where="delay") * 1000))
    except UnitError as exc:
        raise PayloadError(str(exc)) from None


_APPLIES_TO = {
    "promote": "only a scheduled job can be promoted (run now)",
    "reschedule": "only a pending or scheduled job can be rescheduled",
    "set_priority": "only a pending, scheduled or waiting job's priority can change",
}
_WHY_NOT = {
    "pending": "it is pending already: the next free supervisor runs it",
    "waiting": "it waits on its dependencies (depends_on) and runs once they end",
    "active": "it is running",
    "dead": "a dead job is requeued instead (forq dead requeue)",
}


def change(keys: QueueKeys, call: tr.ScriptCall, job_id: str) -> Plan[tr.Changed]:
    """Send promote, reschedule or set_priority; `JobNotFound` when there is no such job,
    `JobStateError` (saying why) when its state refused the change."""
    (reply,) = yield [call]
    changed = tr.parse_changed_job(reply)
    if changed.outcome == "missing":
        raise JobNotFound(f"no job {job_id} in queue {keys.queue}")
    if changed.outcome == "refused":
        if changed.why == "expires":
            detail = ("its expiry before start (expires_in / expire_at) is not after the new "
                      "run-at: it could never run")
        else:
            hint = _WHY_NOT.get(changed.state, "")
            if changed.state == "pending" and call.script != "promote":
                hint = ""
            detail = _APPLIES_TO[call.script] + (f" ({hint})" if hint else "")
        raise JobStateError(job_id, keys.queue, changed.state, call.script, detail)
    return changed
