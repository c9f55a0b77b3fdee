"""The fleet as any tool sees it: the supervisors alive now and the schedules they run.

Supervisors publish both in Redis (`forq.supervisor.redis_io.roster` and `.scheduler`
write them); `forq supervisors`, `forq schedules` and `forq web` read them here, from
any machine, without a supervisor's config (`code_status`: the handler code each
serves). Liveness is judged by Redis time only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import redis

from forq.queue import Queue
from forq.store.keys import SUPERVISORS, QueueKeys
from forq.store.pipelines import run_plan
from forq.store.plans import retained

STALE_AFTER = 10.0  # seconds without a heartbeat: not alive
FORGET_AFTER = 3600.0  # seconds: drop the record entirely
CODE_MAX = 200  # characters of a code name read from a heartbeat (a version is <= 64)


def redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6



CHILD_FIELDS = ("id", "queue", "task", "pid", "elapsed", "timeout", "rss", "memory_limit",
                "lease_left")
# a heartbeat's `children_usage` rows, one per `children` row: CPU seconds so far, CPU %
# since the last heartbeat, RSS bytes at the last sample ("rss" above is the peak)
USAGE_FIELDS = ("cpu", "cpu_percent", "rss_now")


def live_supervisors(client: redis.Redis) -> list[dict[str, Any]]:
    """Supervisors with a recent heartbeat, each with `age` seconds; forgets old ones."""
    now = redis_now(client)
    alive, forget = [], []
    for sid, raw in client.hgetall(SUPERVISORS).items():
        try:
            record = json.loads(raw)
        except ValueError:
            forget.append(sid)
            continue
        age = now - float(record.get("heartbeat", 0))
        record["age"] = age
        if age > FORGET_AFTER:
            forget.append(sid)
        elif age <= STALE_AFTER:
            alive.append(record)
    if forget:
        client.hdel(SUPERVISORS, *forget)
    return sorted(alive, key=lambda r: r.get("name", ""))


def code_status(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a supervisor's heartbeat record says of its handler code, checked (any
    writer of the Redis could have written it): `code` ("VERSION+FINGERPRINT", "" when
    not known), `retiring` (each old fork server still finishing jobs in older code:
    pid, jobs, code) and `reload_error` (the last reload refused: at (seconds, or None),
    error, module; None when the last reload applied)."""
    code = record.get("code")
    retiring = []
    olds = record.get("code_retiring")
    for old in olds if isinstance(olds, list) else []:
        if not isinstance(old, Mapping):
            continue
        pid, jobs, old_code = old.get("pid"), old.get("jobs"), old.get("code")
        if type(pid) is int and type(jobs) is int and jobs >= 0:
            retiring.append({"pid": pid, "jobs": jobs,
                             "code": old_code[:CODE_MAX] if isinstance(old_code, str) else ""})
    refused = record.get("reload_error")
    reload_error = None
    if isinstance(refused, Mapping):
        error, module = refused.get("error"), refused.get("module")
        reload_error = {"at": _number(refused.get("at")),
                        "error": error[:1000] if isinstance(error, str) else "",
                        "module": module[:300] if isinstance(module, str) else ""}
    return {"code": code[:CODE_MAX] if isinstance(code, str) else "", "retiring": retiring,
            "reload_error": reload_error}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def schedule_rows(client: redis.Redis, now: float | None = None,
                  defs: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every schedule with its last and next fire, for `forq schedules` and `forq web`:
    the run-time ones (`forq.schedules`), and those of `defs` when given (a config
    file's, `scheduler.config_defs`), else those the supervisors published (each with
    ``stale`` when no supervisor re-published it lately). `now` is unused: Redis's
    clock decides."""
    from forq.schedules import rows
    from forq.store.pipelines import run_plan
    from forq.store.scripts import Scripts

    found: list[dict[str, Any]] = run_plan(client, Scripts(client), rows(defs))
    return found


def memory_admission(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                               list[dict[str, Any]]]:
    """What live supervisors' heartbeats say of admission by memory (`memory_budget`):
    (budgets: name, budget, used, waiting jobs, for each supervisor with one;
    refused: each job a supervisor refused as over its whole budget, with `refused_by`
    and `over_every`: its limit is over the budget of every live supervisor serving its
    queue, so none will run it as configured). Any Redis writer could have written a
    record: what is not of the expected type is skipped."""
    def size(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    serving: dict[str, list[int | None]] = {}  # queue -> budgets of its live supervisors
    budgets: list[dict[str, Any]] = []
    refused: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        name = str(r.get("name") or r.get("id") or "?")[:CODE_MAX]
        budget = size(r.get("memory_budget"))
        for queue in r.get("queues") or []:
            if isinstance(queue, str):
                serving.setdefault(queue, []).append(budget)
        if budget is None:
            continue
        waiting = [w for w in r.get("memory_waiting") or [] if isinstance(w, list) and len(w) == 4]
        budgets.append({"name": name, "budget": budget, "used": size(r.get("memory_used")) or 0,
                        "waiting": len(waiting),
                        "longest_wait": max((float(w[3]) for w in waiting
                                             if isinstance(w[3], (int, float))), default=0.0),
                        "refused_total": size(r.get("memory_refused_total")) or 0})
        for entry in r.get("memory_refused") or []:
            if not isinstance(entry, dict):
                continue
            job_id, queue, limit = entry.get("id"), entry.get("queue"), size(entry.get("limit"))
            if not isinstance(job_id, str) or not isinstance(queue, str) or limit is None:
                continue
            job = refused.setdefault((queue, job_id), {
                "id": job_id[:CODE_MAX], "queue": queue[:CODE_MAX],
                "task": str(entry.get("task", ""))[:CODE_MAX], "limit": limit,
                "refused_by": []})
            job["refused_by"].append(name)
    for job in refused.values():
        job["over_every"] = all(b is not None and b < job["limit"]
                                for b in serving.get(job["queue"], []))
    return budgets, list(refused.values())


def memory_view(client: redis.Redis, records: list[dict[str, Any]]) -> dict[str, Any]:
    """`memory_admission` for a reader (`forq stats`, `forq supervisors`, the dashboard):
    the budgets by supervisor name, and the refused jobs that have not run since (still
    scheduled, pending or active), read in one round trip."""
    budgets, refused = memory_admission(records)
    if refused:
        pipe = client.pipeline(transaction=False)
        for job in refused:
            pipe.hget(QueueKeys(job["queue"]).job(job["id"]), "state")
        states = pipe.execute()
        refused = [job for job, state in zip(refused, states, strict=True)
                   if state in ("scheduled", "pending", "active", b"scheduled", b"pending",
                                b"active")]
    return {"budgets": {b["name"]: b for b in budgets}, "refused": refused}


def kept_records(client: redis.Redis, name: str, dead: int) -> dict[str, Any]:
    """A queue's kept succeeded and dead records (docs/operations/retention.md): counts,
    and their bytes estimated from a few records' MEMORY USAGE (`plans.retained`)."""
    queue = Queue(name, redis=client)
    buckets = sorted(str(b) for b in client.smembers(queue.keys.kept))
    kept = run_plan(client, queue.scripts, retained(queue.keys, buckets, dead))
    return {"succeeded": kept["succeeded"]["count"], "dead": kept["dead"]["count"],
            "bytes": kept["succeeded"]["bytes"] + kept["dead"]["bytes"]}
