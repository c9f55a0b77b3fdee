"""Every default of a job's policy, in one place.

The supervisor's config starts from `JOB_POLICY` (`[defaults]` overrides it) and passes
the effective policy to the claim script, which writes it into each job it leases;
the other scripts fall back on the same figures when a field is missing (a job
claimed by an older supervisor). Those Lua copies are checked against this table by
tests/test_defaults.py, so the two cannot drift apart.
"""

from __future__ import annotations

JOB_POLICY: dict[str, int | float] = {
    "timeout_ms": 5 * 60 * 1000,
    "memory_limit": 512 * 1024**2,
    "max_attempts": 5,
    "max_crashes": 3,
    # a handler's own retries (`raise Retry(...)`) a job may take before it goes to dead
    "max_snoozes": 100,
    "result_ttl_ms": 24 * 3600 * 1000,
    "idempotency_ttl_ms": 24 * 3600 * 1000,
    "max_result_bytes": 1024**2,
    "backoff_base_ms": 1000,
    "backoff_factor": 2.0,
    "backoff_max_ms": 10 * 60 * 1000,
    "backoff_jitter": 0.2,
}

TIMEOUT_MS = int(JOB_POLICY["timeout_ms"])
MAX_CRASHES = int(JOB_POLICY["max_crashes"])
MAX_RESULT_BYTES = int(JOB_POLICY["max_result_bytes"])
IDEMPOTENCY_TTL_MS = int(JOB_POLICY["idempotency_ttl_ms"])
