"""The job policy as Redis keeps it: once per distinct policy, not in every job.

A supervisor passes its policy (``{"defaults": {...}, "tasks": {task: {...}}}``, JSON) to
claim; lua/claim.lua stores it as the hash ``forq:{q}:policy:<sha1 of that JSON>`` (field
``NAME`` for a default, ``NAME:TASK`` for a task's own) and names it in each job it
claims first (the job's ``policy`` field). A job's limit is then its own field (the
producer's), else its policy's. This module gives readers the same view: the claim's
reply and `Queue.get` show every limit, as when each job carried them all. The policy
options an enqueue gives a job of its own are checked here too (`job_policy_options`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from forq.defaults import ENQUEUE, POLICY_KEYS, PolicyKey
from forq.errors import PayloadError
from forq.units import UnitError


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


# -- the policy options of one enqueue (forq.payload.build_spec) --------------------------

# a job policy key set per job (a forq.defaults row with the enqueue scope), as
# its option ("backoff" for backoff.base, …) and as the field a spec stores
PER_JOB_POLICY = tuple(key for key in POLICY_KEYS if ENQUEUE in key.scopes)
# the options that take a mapping ("backoff", "keep_succeeded", "keep_dead") and their parts
NESTED_PARTS: dict[str, tuple[str, ...]] = {
    option: tuple(k.name.partition(".")[2] for k in PER_JOB_POLICY
                  if k.name.startswith(option + "."))
    for option in dict.fromkeys(k.name.partition(".")[0] for k in PER_JOB_POLICY if "." in k.name)
}
POLICY_OPTIONS = frozenset(key.name.partition(".")[0] for key in PER_JOB_POLICY)


def _policy_value(task: str, key: PolicyKey, value: Any) -> int | float:
    """One per-job policy option, stored as its row says and within its row's bounds
    (the same bounds a config has), or a PayloadError naming it."""
    where = f"task {task!r}: {key.name}"
    if key.kind == "boolean":  # a flag: True or False, not 1 or "yes"
        if isinstance(value, bool):
            return key.stored(value)
        raise PayloadError(f"{where} must be true or false, got {value!r}")
    if key.kind in ("integer", "number") and (
            isinstance(value, bool) or not isinstance(value, (int, float))
            or (key.kind == "integer" and not isinstance(value, int))):
        raise PayloadError(f"{where} must be {'an integer' if key.kind == 'integer' else 'a number'}"
                           f", got {value!r}")
    try:
        stored = key.stored(value)
    except UnitError as exc:
        raise PayloadError(f"{where}: {exc}") from None
    shown = value if key.kind in ("integer", "number") else stored
    if key.positive and stored <= 0:
        raise PayloadError(f"{where} must be more than 0, got {value!r}")
    if not key.minimum <= shown <= key.maximum or shown != shown:  # NaN fails both
        bounds = (f"from {key.minimum:g} to {key.maximum:g}" if key.maximum != math.inf
                  else f"at least {key.minimum:g}")
        raise PayloadError(f"{where} must be {bounds}, got {value!r}")
    return stored


def job_policy_options(task: str, options: Mapping[str, Any], spec: dict[str, Any]) -> None:
    """The per-job policy options (forq.defaults rows with the enqueue scope) into `spec`."""
    if POLICY_OPTIONS.isdisjoint(options):
        return  # most jobs: none given (the walk below costs ~20 µs a job)
    for option, parts in NESTED_PARTS.items():
        given = options.get(option)
        if given is not None and not isinstance(given, Mapping):
            raise PayloadError(f"task {task!r}: {option} must be a mapping of "
                               f"{'/'.join(parts)}, got {type(given).__name__}")
        unknown = sorted(str(k) for k in (given or ()) if k not in parts)
        if unknown:
            raise PayloadError(f"task {task!r}: {option} has unknown key(s) {', '.join(unknown)}"
                               f" (known: {', '.join(parts)})")
    for key in PER_JOB_POLICY:
        option, _, part = key.name.partition(".")
        value = (options.get(option) or {}).get(part) if part else options.get(option)
        if value is not None:
            spec[key.field] = _policy_value(task, key, value)
