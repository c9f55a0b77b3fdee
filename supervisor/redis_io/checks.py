"""What a Redis must be for forq's promise to hold, checked where forq can see it.

An evicting Redis (any ``maxmemory-policy`` but ``noeviction``) deletes keys when it
reaches ``maxmemory``: a job record, a pending set, a lease. Nothing errors, and jobs a
producer was told are enqueued are simply gone. So a supervisor refuses to start on
one (unless ``[redis] allow_eviction = true``), and ``forq stats`` warns. Where CONFIG
is not allowed (a managed Redis, an ACL without it), we say we could not check.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from forq.errors import IncompatibleFormat
from forq.store import dataformat

log = logging.getLogger("forq.supervisor")

SAFE_POLICY = "noeviction"


def eviction_policies(client: Any) -> list[str]:
    """The ``maxmemory-policy`` of the Redis behind `client` (of each node of a cluster).
    Raises redis.RedisError (e.g. NOPERM, an unknown command) when it cannot be read."""
    reply = client.config_get("maxmemory-policy")
    if reply and all(isinstance(v, dict) for v in reply.values()):  # per cluster node
        return sorted({v.get("maxmemory-policy", "") for v in reply.values()})
    return [reply.get("maxmemory-policy", "")] if reply else []


def eviction_problem(client: Any) -> tuple[str | None, str | None]:
    """(the evicting policy, None) when Redis may delete jobs; (None, why) when the
    policy could not be read; (None, None) when it is safe."""
    try:
        policies = eviction_policies(client)
    except redis.ResponseError as exc:  # NOPERM, an unknown or renamed CONFIG
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # a cluster node is down
        return None, f"a node did not answer: {exc}"
    unsafe = [p for p in policies if p != SAFE_POLICY]
    if not policies:
        return None, "CONFIG GET maxmemory-policy answered nothing"
    return (", ".join(unsafe) if unsafe else None), None


def check_at_start(client: Any, allow_eviction: bool, config_path: str, endpoint: str) -> bool:
    """Log what the supervisor must know about this Redis; False: refuse to start."""
    try:
        dataformat.ensure(client, endpoint)
    except IncompatibleFormat as exc:
        log.error("refusing to start: %s", exc)
        return False
    policy, unknown = eviction_problem(client)
    if unknown:
        log.warning("could not check Redis's maxmemory-policy at %s (%s): make sure it is "
                    "noeviction, or Redis may delete jobs when it fills up", endpoint, unknown)
    elif policy and not allow_eviction:
        log.error("refusing to start: Redis at %s has maxmemory-policy %s, so it may evict "
                  "(delete) jobs when it fills up; set maxmemory-policy noeviction, or "
                  "[redis] allow_eviction = true in %s to run anyway", endpoint, policy,
                  config_path)
        return False
    elif policy:
        log.warning("Redis at %s has maxmemory-policy %s: it may evict (delete) jobs when "
                    "it fills up ([redis] allow_eviction = true)", endpoint, policy)
    return True
