"""The registry of live supervisors, for `forq workers` and the "no supervisor" alert.

A hash field per supervisor holds a JSON record refreshed every heartbeat; readers
judge liveness by the heartbeat's age in Redis time, so no clock but Redis's matters.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from forq.keys import SUPERVISORS

VERSION = "0.2.0"  # pyproject.toml's version (tests/test_defaults.py checks)
STALE_AFTER = 10.0  # seconds without a heartbeat: not alive
FORGET_AFTER = 3600.0  # seconds: drop the record entirely


def _redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6


class SupervisorRegistry:
    def __init__(self, client: redis.Redis, supervisor_id: str) -> None:
        self.client = client
        self.id = supervisor_id
        self.started = time.time()

    def beat(self, record: dict[str, Any]) -> None:
        now = _redis_now(self.client)
        record = dict(record, id=self.id, version=VERSION, heartbeat=now,
                      started=self.started)
        self.client.hset(SUPERVISORS, self.id, json.dumps(record))

    def leave(self) -> None:
        self.client.hdel(SUPERVISORS, self.id)


def live_supervisors(client: redis.Redis) -> list[dict[str, Any]]:
    """Supervisors with a recent heartbeat, each with `age` seconds; forgets old ones."""
    now = _redis_now(client)
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
