"""Every key of a job's policy, with its default, in one place.

Each `PolicyKey` is one row: the key as written (in `[defaults]`, a `[[queue]]`, a
`[tasks."name"]` table, and for most as an enqueue option), the field a job stores, the
kind of value, its default as a config would write it, its bounds and a line of doc.
The supervisor's config reads these keys from the rows (supervisor/config/schema.py
extends them with its readers), the producer's enqueue options come from them
(forq.payload), and the reference page (docs/configuration.md) lists them.

The supervisor's config starts from `JOB_POLICY` (`[defaults]` overrides it) and passes
the effective policy to the claim script, which writes it into each job it leases;
the other scripts fall back on the same figures when a field is missing (a job
claimed by an older supervisor). Those Lua copies are checked against this table by
tests/test_defaults.py, so the two cannot drift apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from forq.units import parse_duration, parse_size

# where a policy key may be set: the three config tables, and per job by the producer
DEFAULTS = "[defaults]"
QUEUE = "[[queue]]"
TASKS = '[tasks."name"]'
ENQUEUE = "enqueue"
EVERYWHERE = (DEFAULTS, QUEUE, TASKS, ENQUEUE)


@dataclass(frozen=True)
class PolicyKey:
    """One key of a job's policy."""

    name: str  # as written: "timeout", or "backoff.base" inside `backoff = {...}`
    field: str  # what a job record stores: "timeout_ms"
    kind: Literal["duration", "size", "integer", "number", "boolean"]  # durations in ms
    default: str | int | float  # as a config writes it: "5m", "512MiB", 5
    doc: str
    minimum: float = 0
    maximum: float = math.inf
    positive: bool = False  # a duration that must be more than 0
    scopes: tuple[str, ...] = EVERYWHERE

    def stored(self, value: str | int | float | None = None) -> int | float:
        """`value` (the default when None) in the unit a job record stores."""
        value = self.default if value is None else value
        if self.kind == "duration":
            return int(round(parse_duration(value) * 1000))
        if self.kind == "size":
            return parse_size(value)
        if self.kind == "boolean":
            return int(bool(value))  # 1 or 0: a job record and the Lua scripts read numbers
        return int(value) if self.kind == "integer" else float(value)


POLICY_KEYS: tuple[PolicyKey, ...] = (
    PolicyKey("timeout", "timeout_ms", "duration", "5m",
              "Wall-clock limit for one attempt.", positive=True),
    PolicyKey("memory_limit", "memory_limit", "size", "512MiB",
              "Memory of the job's process tree (RSS, or its cgroup's); 0: no limit."),
    PolicyKey("max_attempts", "max_attempts", "integer", 5,
              "Attempts (handler errors, timeouts) before the job is dead.", minimum=1),
    PolicyKey("max_crashes", "max_crashes", "integer", 3,
              "Crashes (segfault, OOM kill, lost lease) tolerated before the job is dead."),
    PolicyKey("max_snoozes", "max_snoozes", "integer", 100,
              "Times a handler may put its job off (`Retry`, `throttle`) before it is dead."),
    PolicyKey("result_ttl", "result_ttl_ms", "duration", "1d",
              "The longest a succeeded or cancelled record is kept (0 keeps none); see keep_succeeded."),
    PolicyKey("keep_succeeded.age", "keep_succeeded_ms", "duration", "1h",
              "A succeeded job's record is trimmed this long after its end (docs/operations/retention.md)."),
    PolicyKey("keep_succeeded.count", "keep_succeeded_count", "integer", 10000,
              "At most this many succeeded records per queue (jobs sharing this count)."),
    PolicyKey("keep_dead.age", "keep_dead_ms", "duration", "30d",
              "A dead job's record is trimmed this long after its death."),
    PolicyKey("keep_dead.count", "keep_dead_count", "integer", 10000,
              "At most this many dead records per queue (jobs sharing this count)."),
    PolicyKey("keep_history", "keep_history", "boolean", False,
              "A succeeded record keeps its history and payload (else state, result, times)."),
    PolicyKey("idempotency_ttl", "idempotency_ttl_ms", "duration", "1d",
              "An idempotent task's completed run is never repeated within this.",
              positive=True, scopes=(DEFAULTS, QUEUE, TASKS)),
    PolicyKey("max_result_bytes", "max_result_bytes", "size", "1MiB",
              "A larger result is a failure, with that reason.", minimum=1),
    PolicyKey("backoff.base", "backoff_base_ms", "duration", "1s",
              "First retry delay; retry n waits `base * factor^(n-1)`, at most `max`."),
    PolicyKey("backoff.factor", "backoff_factor", "number", 2.0,
              "Each retry waits this many times longer than the one before.", minimum=1.0),
    PolicyKey("backoff.max", "backoff_max_ms", "duration", "10m",
              "The longest retry delay (not less than `base`)."),
    PolicyKey("backoff.jitter", "backoff_jitter", "number", 0.2,
              "Each delay moves at random by up to this fraction of itself.",
              minimum=0.0, maximum=1.0),
    # the circuit breaker per task (lua/includes/breaker.lua, docs/guide/breaker.md): a
    # deploy that makes every job of a task crash the same way pauses that task alone.
    # 20 distinct jobs in 60 s, 90% of the task's ends: a task at a normal error rate
    # (even 50% of its ends failing) never trips, nor a rare task's few failures
    PolicyKey("breaker.failures", "breaker_failures", "integer", 20,
              "Distinct jobs of a task ending the same way that trip its breaker; 0: off.",
              scopes=(DEFAULTS, QUEUE, TASKS)),
    PolicyKey("breaker.window", "breaker_window_ms", "duration", "60s",
              "The window those jobs end in (10 s buckets, at most 10m).",
              positive=True, scopes=(DEFAULTS, QUEUE, TASKS)),
    PolicyKey("breaker.ratio", "breaker_ratio", "number", 0.9,
              "And that end is at least this share of all the task's ends in the window.",
              minimum=0.0, maximum=1.0, scopes=(DEFAULTS, QUEUE, TASKS)),
    PolicyKey("breaker.cooldown", "breaker_cooldown_ms", "duration", "10m",
              "A tripped task resumes by itself after this; 0: only `forq resume --task`.",
              scopes=(DEFAULTS, QUEUE, TASKS)),
)

JOB_POLICY: dict[str, int | float] = {key.field: key.stored() for key in POLICY_KEYS}

TIMEOUT_MS = int(JOB_POLICY["timeout_ms"])
MAX_CRASHES = int(JOB_POLICY["max_crashes"])
MAX_RESULT_BYTES = int(JOB_POLICY["max_result_bytes"])
IDEMPOTENCY_TTL_MS = int(JOB_POLICY["idempotency_ttl_ms"])
