"""Invariant 13: the queues' event streams against the job records, the on_dead jobs
against the deaths, and debounced jobs against the calls that made them.

The events are written by the same scripts as the transitions (lua/includes/events.lua),
and chaos keeps them all (`events_keep`), so for every job they must tell the story its
record and history tell, whatever the faults did: one `enqueued`; a `started` per claim;
a `failed` per failed attempt or crash the record counted; exactly one end, the record's
state, a death with the record's reason. Every death (not an on_dead job's own) enqueued
one on_dead job, `<id>-on-dead-1`, naming it; and a debounced job ran with the `v` of
the last call that returned its id (a later call either replaced it before it started, or
got another job while it ran).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from forq import Job, QueueEvent

ENDS = ("succeeded", "dead", "cancelled")
REASON_MAX = 200  # bytes of a reason an event keeps (lua/includes/events.lua)


def _clip(text: str, size: int) -> str:
    return text.encode()[:size].decode(errors="ignore")


def story_problems(job: Job, events: list[QueueEvent]) -> list[str]:
    """What the events of `job` say that its record and history do not."""
    problems = []
    kinds = [e.kind for e in events]
    if kinds.count("enqueued") != 1:
        problems.append(f"{kinds.count('enqueued')} 'enqueued' events")
    history = [h for h in job.history if isinstance(h, dict)]
    whole = not history or history[0].get("event") == "enqueued"  # not trimmed to 100
    if whole:
        claims = sum(1 for h in history if h.get("event") == "claimed")
        if kinds.count("started") != claims:
            problems.append(f"{kinds.count('started')} 'started' events, {claims} claims")
    # an attempt counted: a failure's, or a snooze's that counts one (raise Retry(...))
    attempts = sum(1 for e in events if e.kind in ("failed", "snoozed") and "attempt" in e.fields)
    crashes = sum(1 for e in events if e.kind == "failed" and "crashes" in e.fields)
    succeeded = job.state == "succeeded"
    if attempts != job.attempts - (1 if succeeded else 0):
        problems.append(f"{attempts} failed attempts in the events, {job.attempts} attempts "
                        f"in the record ({job.state})")
    if crashes != job.crashes:
        problems.append(f"{crashes} crashes in the events, {job.crashes} in the record")
    ends = [e for e in events if e.kind in ENDS]
    if [e.kind for e in ends] != ([job.state] if job.state in ENDS else []):
        problems.append(f"ends {[e.kind for e in ends]} in the events, record {job.state}")
    elif job.state == "dead":
        reason = str(job.fields.get("dead_reason") or "")
        if ends[0].reason != _clip(reason, REASON_MAX):
            problems.append(f"dead with {ends[0].reason!r}, record {reason[:80]!r}")
    if ends and events[-1] is not ends[0]:
        problems.append(f"'{events[-1].kind}' after its end")
    return problems


def on_dead_problems(jobs: Mapping[str, Job | None]) -> list[str]:
    """Each dead job's on_dead job: there, naming it, none for an on_dead job."""
    problems = []
    for jid, job in jobs.items():
        if job is None or job.state != "dead":
            continue
        notice = jobs.get(f"{jid}-on-dead-1")
        if job.fields.get("on_dead_of"):
            if notice is not None:
                problems.append(f"{jid}: an on_dead job that died set off another ({notice.id})")
            continue
        if notice is None:
            problems.append(f"{jid}: dead ({job.fields.get('dead_reason')}), no on_dead job")
        elif notice.kwargs.get("job_id") != jid or notice.fields.get("on_dead_of") != jid:
            problems.append(f"{notice.id}: on_dead job of {jid} names {notice.kwargs}")
        elif notice.kwargs.get("reason") != _clip(str(job.fields.get("dead_reason")), 1000):
            problems.append(f"{notice.id}: reason {notice.kwargs.get('reason')!r}, the dead "
                            f"job's {job.fields.get('dead_reason')!r}")
    for jid, job in jobs.items():
        dead_of = job.fields.get("on_dead_of") if job is not None else None
        if dead_of and (jobs.get(dead_of) is None or jobs[dead_of].state != "dead"):
            problems.append(f"{jid}: on_dead job of {dead_of}, which is not dead")
    return problems


def debounce_problems(calls: Iterable[list[Any]], jobs: Mapping[str, Job | None]) -> list[str]:
    """Each job a debounced call returned ran (or holds) the last such call's `v`."""
    last: dict[str, int] = {}
    for _key, v, jid, _status in calls:
        last[jid] = max(v, last.get(jid, -1))
    problems = []
    for jid, v in last.items():
        job = jobs.get(jid)
        if job is None:
            continue  # invariant 1 says so
        if job.kwargs.get("v") != v:
            problems.append(f"{jid}: holds v={job.kwargs.get('v')}, the last call returning it "
                            f"had v={v}")
        result = job.result if isinstance(job.result, dict) else {}
        if job.state == "succeeded" and result.get("v") != v:
            problems.append(f"{jid}: ran with v={result.get('v')}, the last call had v={v}")
    return problems


def check(inv: Any, jobs: Mapping[str, Job | None], events: Mapping[str, list[QueueEvent]],
          calls: list[list[Any]], kept_from: Mapping[str, float] | None = None) -> None:
    """Fail invariant `inv` (the checker's 13) for each problem found. `kept_from`: per
    queue, the time (s) of its oldest event kept: a job enqueued before it (a stream
    trimmed at its cap, in a long soak) has lost the start of its story, and is not
    checked."""
    kept_from = kept_from or {}
    skipped = 0
    for jid, job in sorted(jobs.items()):
        if job is None:
            continue
        if int(job.fields.get("enqueued_at") or 0) < kept_from.get(job.queue, 0) * 1000:
            skipped += 1
            continue
        for problem in story_problems(job, events.get(jid, [])):
            inv.fail(f"{jid}: {problem}")
    if skipped:
        inv.notes.append(f"{skipped} jobs enqueued before their stream's oldest event kept: "
                         "not checked")
    for problem in on_dead_problems(jobs):
        inv.fail(problem)
    for problem in debounce_problems(calls, jobs):
        inv.fail(problem)
    replaced = sum(1 for _k, _v, _j, status in calls if status == "replaced")
    inv.notes.append(f"{sum(len(v) for v in events.values())} events checked; "
                     f"{len(calls)} debounced calls, {replaced} replaced a waiting job, "
                     f"{len({c[2] for c in calls})} jobs ran")
