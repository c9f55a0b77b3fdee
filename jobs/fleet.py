"""The fleet as any tool sees it: the supervisors alive now and the schedules they run.

Supervisors publish both in Redis (`forq.supervisor.redis_io.roster` and `.scheduler`
write them); `forq workers`, `forq schedules` and `forq web` read them here, from any
machine, without a supervisor's config. Liveness is judged by Redis time only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import redis

from forq.store.keys import SUPERVISORS

STALE_AFTER = 10.0  # seconds without a heartbeat: not alive
FORGET_AFTER = 3600.0  # seconds: drop the record entirely


def redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6



CHILD_FIELDS = ("id", "queue", "task", "pid", "elapsed", "timeout", "rss", "memory_limit",
                "lease_left")


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
