"""What the dashboard shows, read from Redis: plain dicts, no HTTP, no HTML.

Every list is one page read by rank from its index (ZRANGE by index is O(log n + page)),
plus one pipelined HMGET of the page's job fields: a page costs the same with ten
pending jobs or ten million. Counts come from ZCARD. Nothing here loads a whole set.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import redis

from forq import Queue, fleet, known_queues
from forq.fleet import CHILD_FIELDS, USAGE_FIELDS, live_supervisors, memory_view, schedule_rows
from forq.job import Job
from forq.store.keys import QueueKeys
from forq.store.plans import trip_reason
from forq.units import format_size

PAGE_SIZE = 50
CHART_MINUTES = 30  # the rate chart's span; Redis keeps per-minute counts for an hour
RUNNING_CAP = 2000  # active jobs listed per queue on "running now"
OUTPUT_TAIL = 4096  # characters of a job's output shown on its page

# a list: its index (a QueueKeys attribute), newest or oldest first, what the score means
LISTS: dict[str, tuple[str, bool, str]] = {
    "pending": ("pending", False, "claim order"),
    "scheduled": ("scheduled", False, "due"),
    "waiting": ("waiting", False, "enqueued; waits on its dependencies"),
    "active": ("active", False, "lease deadline"),
    "dead": ("dead", True, "died"),
    "finished": ("finished", True, "finished"),
}
ROW_FIELDS = ("task", "state", "attempts", "crashes", "enqueued_at", "run_at", "started_at",
              "finished_at", "priority", "key", "dead_reason", "error", "owner")


def redis_now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return default


def _reason(fields: dict[str, Any]) -> str:
    if fields.get("dead_reason"):
        return str(fields["dead_reason"])
    raw = fields.get("error")
    if raw:
        try:
            err = json.loads(raw)
        except ValueError:
            return str(raw)
        if isinstance(err, dict):
            return str(err.get("reason") or err.get("message") or "")
    return ""


# -- overview ---------------------------------------------------------------------------


def overview(client: redis.Redis) -> dict[str, Any]:
    """Every queue's counts, limits, per-minute outcomes and oldest wait; every live
    supervisor. Two pipelined round trips for all the queues together."""
    now_ms = redis_now_ms(client)
    names = known_queues(client)
    minute = now_ms // 60000
    pipe = client.pipeline(transaction=False)
    for name in names:
        k = QueueKeys(name)
        pipe.zcard(k.pending)
        pipe.zcard(k.scheduled)
        pipe.zcard(k.active)
        pipe.zcard(k.dead)
        pipe.zcard(k.waiting)
        pipe.hgetall(k.limits)
        pipe.zrange(k.pending, 0, 0)
        pipe.get(k.groups_pending)  # grouped jobs wait in their groups' sets
        pipe.hgetall(k.tripped)  # tasks their circuit breaker tripped
        for m in range(minute - CHART_MINUTES + 1, minute + 1):
            pipe.hmget(k.minute(m), "succeeded", "failed", "crashed")
    per_queue = 9 + CHART_MINUTES
    replies = pipe.execute() if names else []
    queues = []
    heads = []
    for i, name in enumerate(names):
        r = replies[i * per_queue:(i + 1) * per_queue]
        pending, scheduled, active, dead, waiting, limits, head, grouped, tripped = r[:9]
        pending += _int(grouped)
        chart = [(_int(ok), _int(failed) + _int(crashed)) for ok, failed, crashed in r[9:]]
        # a sliding minute, as `forq stats` has it: this minute so far plus the part of
        # the previous one that is still within the last 60 s
        frac = (now_ms % 60000) / 60000
        ok_min, failed_min = (round(cur + prev * (1 - frac))
                              for cur, prev in zip(chart[-1], chart[-2], strict=True))
        rate_per_ms = float(limits["rate"]) if limits.get("rate") else None
        queues.append({
            "name": name, "pending": pending, "scheduled": scheduled, "active": active,
            "waiting": waiting,
            # a paused queue (issue #15) has "paused" in its limits hash
            "dead": dead, "paused": "paused" in limits, "ok_per_min": ok_min,
            # a handler's current().throttle (or forq throttle): seconds left, else None
            "throttled_for": (max(0, _int(limits["throttled_until"]) - now_ms) / 1000 or None)
            if limits.get("throttled_until") else None,
            "failed_per_min": failed_min, "chart": chart,
            "rate_per_second": rate_per_ms * 1000 if rate_per_ms else None,
            "max_in_flight": _int(limits.get("max_in_flight")) or None,
            "oldest_pending_age": None,
            # task -> its pattern ("signal:SIGSEGV"): `forq resume QUEUE --task T`
            "tripped": {task: trip_reason(raw, 0, now_ms)["pattern"]
                        for task, raw in sorted(tripped.items())},
        })
        if head:
            heads.append((len(queues) - 1, QueueKeys(name).job(head[0])))
    for q in queues:  # the ended records each keeps (docs/operations/retention.md)
        q["retained"] = fleet.kept_records(client, q["name"], q["dead"])
    if heads:
        pipe = client.pipeline(transaction=False)
        for _, key in heads:
            pipe.hmget(key, "enqueued_at", "run_at")
        for (index, _), (enqueued, run_at) in zip(heads, pipe.execute(), strict=True):
            if enqueued:
                since = max(_int(enqueued), _int(run_at))
                queues[index]["oldest_pending_age"] = max(0.0, (now_ms - since) / 1000)
    supervisors = live_supervisors(client)
    return {"now_ms": now_ms, "queues": queues, "supervisors": supervisors,
            "memory": memory_view(client, supervisors)}


# -- running now ------------------------------------------------------------------------


def running(client: redis.Redis) -> dict[str, Any]:
    """Every active job with what its supervisor last said of its child.

    The active index gives each lease's deadline in Redis time (authoritative); the
    supervisors' heartbeat records give pid, elapsed, timeout, RSS and limit. An active
    job no live supervisor lists is shown too: its lease runs out and the reaper takes it.
    """
    now_ms = redis_now_ms(client)
    supervisors = live_supervisors(client)
    children: dict[str, dict[str, Any]] = {}
    held: set[str] = set()  # leased ahead of a free slot (prefetch): no child yet
    for sup in supervisors:
        listed = sup.get("held")
        if isinstance(listed, list):  # an older supervisor's record has none
            held.update(job_id for job_id in listed if isinstance(job_id, str))
        age_ms = float(sup.get("age", 0)) * 1000
        usage = sup.get("children_usage")
        usage = usage if isinstance(usage, list) else []  # an older supervisor's: none
        for i, row in enumerate(sup.get("children") or []):
            if not isinstance(row, list) or len(row) != len(CHILD_FIELDS):
                continue
            child = dict(zip(CHILD_FIELDS, row, strict=True))
            seen = usage[i] if i < len(usage) else None
            if isinstance(seen, list) and len(seen) == len(USAGE_FIELDS):  # `forq top`'s
                child.update((k, v) for k, v in zip(USAGE_FIELDS, seen, strict=True)
                             if isinstance(v, (int, float)) and not isinstance(v, bool))
            elapsed = child.get("elapsed")
            if isinstance(elapsed, (int, float)):
                child["started_ms"] = now_ms - age_ms - elapsed * 1000
            child["supervisor"] = sup.get("name") or sup.get("id")
            child["host"] = sup.get("host")
            children[str(child["id"])] = child
    names = known_queues(client)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.zrange(QueueKeys(name).active, 0, RUNNING_CAP - 1, withscores=True)
        pipe.zcard(QueueKeys(name).active)
    replies = pipe.execute() if names else []
    jobs = []
    truncated = 0
    for i, name in enumerate(names):
        page, total = replies[2 * i], replies[2 * i + 1]
        truncated += max(0, total - len(page))
        for job_id, deadline in page:
            child = children.get(job_id, {})
            jobs.append({"id": job_id, "queue": name, "lease_deadline_ms": int(deadline),
                         "child": child, "task": child.get("task"),
                         "held": not child and job_id in held})
    if jobs:  # task, start time and owner of the jobs no record covers, from their hashes
        pipe = client.pipeline(transaction=False)
        for job in jobs:
            pipe.hmget(QueueKeys(job["queue"]).job(job["id"]), "task", "started_at", "owner",
                       "timeout_ms", "memory_limit", "progress", "progress_message")
        for job, (task, started, owner, timeout_ms, mem, progress, progress_message) in zip(
                jobs, pipe.execute(), strict=True):
            job["task"] = job["task"] or task
            job["owner"] = owner
            job["progress"] = _progress(progress)
            job["progress_message"] = str(progress_message or "")[:200]
            child = job["child"]
            if "started_ms" not in child and started:
                child["started_ms"] = _int(started)
            child.setdefault("timeout", _int(timeout_ms) / 1000 if timeout_ms else None)
            child.setdefault("memory_limit", _int(mem) or None)
    names_by_id = {str(s.get("id")): s.get("name") or s.get("id") for s in supervisors}
    for job in jobs:  # claimed since its supervisor's last heartbeat, or orphaned
        job["owner_alive"] = job.get("owner") in names_by_id
        job["owner_name"] = names_by_id.get(job.get("owner") or "", job.get("owner"))
    jobs.sort(key=lambda j: j["child"].get("started_ms") or now_ms)
    return {"now_ms": now_ms, "jobs": jobs, "supervisors": supervisors, "truncated": truncated}


def _progress(raw: str | None) -> Any:
    """A handler's progress report, whatever shape it has: shown, never trusted."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return str(raw)[:200]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return json.dumps(value)[:200]


# -- lists ------------------------------------------------------------------------------


@dataclass
class Page:
    queue: str
    state: str
    offset: int
    limit: int
    total: int
    rows: list[dict[str, Any]]
    score_label: str

    @property
    def has_next(self) -> bool:
        return self.offset + len(self.rows) < self.total


def job_page(client: redis.Redis, queue: str, state: str, offset: int = 0,
             limit: int = PAGE_SIZE) -> Page:
    """One page of a queue's list `state` (see LISTS), in that list's order."""
    attr, newest_first, label = LISTS[state]
    key = getattr(QueueKeys(queue), attr)
    offset = max(0, offset)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(key)
    if newest_first:
        pipe.zrevrange(key, offset, offset + limit - 1, withscores=True)
    else:
        pipe.zrange(key, offset, offset + limit - 1, withscores=True)
    total, entries = pipe.execute()
    return Page(queue, state, offset, limit, total, rows(client, queue, entries), label)


def rows(client: redis.Redis, queue: str, entries: Sequence[tuple[str, float]]) -> list[dict[str, Any]]:
    """The table row of each (id, score); an id whose record expired shows as such."""
    if not entries:
        return []
    k = QueueKeys(queue)
    pipe = client.pipeline(transaction=False)
    for job_id, _ in entries:
        pipe.hmget(k.job(job_id), *ROW_FIELDS)
    out = []
    for (job_id, score), values in zip(entries, pipe.execute(), strict=True):
        fields = {f: v for f, v in zip(ROW_FIELDS, values, strict=True) if v is not None}
        out.append({"id": job_id, "queue": queue, "score": score, "exists": bool(fields),
                    "task": fields.get("task", ""), "state": fields.get("state", "expired"),
                    "attempts": _int(fields.get("attempts")),
                    "crashes": _int(fields.get("crashes")),
                    "enqueued_at": _int(fields.get("enqueued_at")) or None,
                    "run_at": _int(fields.get("run_at")) or None,
                    "finished_at": _int(fields.get("finished_at")) or None,
                    "priority": _int(fields.get("priority")), "key": fields.get("key"),
                    "owner": fields.get("owner"), "reason": _reason(fields)})
    return out


# -- search and one job ---------------------------------------------------------------


def search(client: redis.Redis, text: str) -> list[dict[str, str]]:
    """Jobs whose id is `text`, or whose idempotency key is `text`, in any queue
    (two pipelined round trips however many queues)."""
    text = text.strip()
    if not text:
        return []
    names = known_queues(client)
    pipe = client.pipeline(transaction=False)
    for name in names:
        k = QueueKeys(name)
        pipe.exists(k.job(text))
        pipe.get(k.prefix + "unique:" + text)
    replies = pipe.execute() if names else []
    found = []
    for i, name in enumerate(names):
        if replies[2 * i]:
            found.append({"queue": name, "id": text, "match": "id"})
        holder = replies[2 * i + 1]
        if holder:
            found.append({"queue": name, "id": holder, "match": "key"})
    return found


def job_detail(client: redis.Redis, queue: str, job_id: str) -> dict[str, Any]:
    """Everything the job page shows; `JobNotFound` if the record is gone."""
    job: Job = Queue(queue, redis=client).get(job_id)
    f = job.fields
    output = f.get("output")
    k = QueueKeys(queue)
    pipe = client.pipeline(transaction=False)
    pipe.zscore(k.active, job_id)
    pipe.exists(k.job(str(f["parent"]))) if f.get("parent") else pipe.exists(k.job(job_id))
    lease_deadline, parent_here = pipe.execute()
    links = []
    if f.get("parent"):
        links.append({"label": "parent", "id": str(f["parent"]),
                      "queue": queue if parent_here else None})
    for parent in job.depends_on:  # within one queue (depends_on is refused across queues)
        links.append({"label": "depends on", "id": str(parent), "queue": queue})
    if job.batch:
        links.append({"label": "batch", "id": job.batch,
                      "href": f"/batches/{quote(str(f.get('batch_queue') or queue))}/"
                              f"{quote(job.batch)}"})
    if f.get("callback_of"):  # a batch's callback: its parents are the batch's members
        links.append({"label": "callback of batch", "id": str(f["callback_of"]),
                      "href": f"/batches/{quote(queue)}/{quote(str(f['callback_of']))}"})
    if f.get("child_batch"):  # the batch this job opened from its handler
        links.append({"label": "opened batch", "id": str(f["child_batch"]),
                      "href": f"/batches/{quote(queue)}/{quote(str(f['child_batch']))}"})
    return {
        "job": job,
        "fields": f,
        "args": job.args,
        "kwargs": job.kwargs,
        "result": job.result if "result" in f else None,
        "has_result": "result" in f,
        "error": job.error,
        "reason": job.reason,
        "output": str(output)[-OUTPUT_TAIL:] if output else None,
        "memory_trail": [(before, format_size(size)) for before, size in job.memory_trail],
        "history": job.history,
        "lease_deadline_ms": int(lease_deadline) if lease_deadline is not None else None,
        "links": links,
        "progress": _progress(f.get("progress")),
        "progress_message": str(f.get("progress_message") or "")[:500],
        "steps": job.step_records(),  # durable steps (`current().step`), in order
    }


# -- batches ---------------------------------------------------------------------------


def batch_page(client: redis.Redis, queue: str, batch_id: str, offset: int = 0,
               limit: int = PAGE_SIZE) -> dict[str, Any]:
    """A batch's record and one page of its members (a batch of 100,000 is never
    read whole); `JobNotFound` if no such batch."""
    keys = QueueKeys(queue)
    status = Queue(queue, redis=client).get_batch(batch_id).status()
    offset = max(0, offset)
    members = keys.batch(batch_id) + ":members"
    pipe = client.pipeline(transaction=False)
    pipe.llen(members)
    pipe.lrange(members, offset, offset + limit - 1)
    total, listed = pipe.execute()
    pairs = []
    for entry in listed:
        try:
            member_queue, member_id = json.loads(entry)
            pairs.append((str(member_queue), str(member_id)))
        except (ValueError, TypeError):
            continue  # not written by batch.lua: skip rather than fail the page
    pipe = client.pipeline(transaction=False)
    for member_queue, member_id in pairs:
        pipe.hmget(QueueKeys(member_queue).job(member_id), *ROW_FIELDS)
    rows_ = []
    for (member_queue, member_id), values in zip(pairs, pipe.execute() if pairs else [],
                                                 strict=True):
        fields = {f: v for f, v in zip(ROW_FIELDS, values, strict=True) if v is not None}
        rows_.append({"id": member_id, "queue": member_queue, "exists": bool(fields),
                      "task": fields.get("task", ""), "state": fields.get("state", "expired"),
                      "attempts": _int(fields.get("attempts")),
                      "finished_at": _int(fields.get("finished_at")) or None,
                      "reason": _reason(fields)})
    return {"status": status, "rows": rows_, "total": total, "offset": offset, "limit": limit}


# -- schedules --------------------------------------------------------------------------


def schedules(client: redis.Redis) -> dict[str, Any]:
    now_ms = redis_now_ms(client)
    return {"now_ms": now_ms, "rows": schedule_rows(client, now_ms / 1000)}
