"""The job policy as Redis keeps it: once per distinct policy, not in every job.

A supervisor passes its policy (``{"defaults": {...}, "tasks": {task: {...}}}``, JSON) to
claim; lua/claim.lua stores it as the hash ``forq:{q}:policy:<sha1 of that JSON>`` (field
``NAME`` for a default, ``NAME:TASK`` for a task's own) and names it in each job it
claims first (the job's ``policy`` field). A job's limit is then its own field (the
producer's), else its policy's. This module gives readers the same view: the claim's
reply and `Queue.get` show every limit, as when each job carried them all.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=64)
def policy_sha(policy_json: str) -> str:
    """The name claim gives the policy (Redis's ``redis.sha1hex`` of the same bytes)."""
    return hashlib.sha1(policy_json.encode()).hexdigest()


def _lua_str(value: Any) -> str:
    """A number as Lua's tostring writes it (``2`` for 2.0), so both sides agree."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@lru_cache(maxsize=64)
def flatten(policy_json: str) -> dict[str, str]:
    """A policy JSON as claim stores it: ``NAME`` and ``NAME:TASK`` fields."""
    policy = json.loads(policy_json) if policy_json else {}
    flat = {name: _lua_str(v) for name, v in (policy.get("defaults") or {}).items()}
    for task, limits in (policy.get("tasks") or {}).items():
        flat.update({f"{name}:{task}": _lua_str(v) for name, v in limits.items()})
    return flat


def fill(record: dict[str, str], flat: dict[str, str]) -> dict[str, str]:
    """`record` with each limit it lacks taken from its policy (`flat`, as stored): the
    task's own value, else the default. The producer's own limits stay."""
    task = record.get("task", "")
    for field, value in flat.items():
        name, sep, for_task = field.partition(":")
        if name in record or (sep and for_task != task):
            continue
        record[name] = value if sep else flat.get(f"{name}:{task}", value)
    return record
