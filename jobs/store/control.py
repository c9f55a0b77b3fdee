"""A handler's own transitions as calls (sans-IO, as `forq.store.transitions`): its
throttle of its queue or group (lua/throttle.lua) and an operator's (set_throttle.lua),
and the read of its parents' results (parents.lua); an operator's resume of a task its
circuit breaker tripped (resume_task.lua). A snooze is a mode of `fail_call`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from forq.store.keys import QueueKeys
from forq.store.transitions import ScriptCall


class Throttled(NamedTuple):
    """throttle.lua's answer."""

    # "throttled" | "dead" (past max_snoozes) | "cancelled" (its cancel had been asked) |
    # "lost"
    outcome: str
    until_ms: int  # the end of the throttle in force (Redis ms), 0 when none was set


def throttle_call(keys: QueueKeys, job_id: str, token: str, delay_ms: int, group: bool,
                  reason: str) -> ScriptCall:
    """The handler of the job under `token` throttled its queue (`group`: its group) for
    `delay_ms` (capped by the supervisor); the job goes back to pending."""
    return ScriptCall("throttle", (keys.active, keys.limits, keys.dead),
                      (keys.prefix, job_id, token, int(delay_ms),
                       "group" if group else "queue", reason))


def parse_throttle(reply: Sequence[Any]) -> Throttled:
    return Throttled(str(reply[0]), int(reply[1]))


def set_throttle_call(keys: QueueKeys, delay_ms: int, group: str | None = None) -> ScriptCall:
    """Throttle the queue (or `group`) for `delay_ms` from Redis's now; 0 lifts it."""
    return ScriptCall("set_throttle", (keys.limits,), (keys.prefix, int(delay_ms), group or ""))


class TaskResumed(NamedTuple):
    """resume_task.lua's answer."""

    untripped: int  # tasks this call untripped
    moved: int  # parked jobs put back in pending
    left: int  # parked jobs of untripped tasks still to put back (the next call)
    tripped: dict[str, str]  # the tasks still tripped: task -> its reason (JSON)


RESUME_BATCH = 1000  # parked jobs put back per call


def resume_task_call(keys: QueueKeys, task: str = "", most: int = RESUME_BATCH) -> ScriptCall:
    """Untrip `task`'s circuit breaker and put its parked jobs back (at most `most` a
    call); `task` "": the reaper's pass, every task whose cool-down has passed."""
    return ScriptCall("resume_task", (keys.tripped, keys.limits), (keys.prefix, task, int(most)))


def parse_resume_task(reply: Sequence[Any]) -> TaskResumed:
    flat = list(reply[3]) if len(reply) > 3 else []
    return TaskResumed(int(reply[0]), int(reply[1]), int(reply[2]),
                       dict(zip(flat[::2], flat[1::2], strict=True)))


class ParentsPage(NamedTuple):
    """A page of a running job's parents (lua/parents.lua)."""

    status: str  # "ok", "lost" (stale token) or "expired" (a callback's batch is gone)
    total: int
    next: int  # the index of the next page's first parent, -1 after the last page
    # per parent [queue, id, state, result JSON, reason]; [queue, id] alone for one on
    # another queue (read apart); state "" when its record is gone
    entries: list[list[str]]


def parents_call(keys: QueueKeys, job_id: str, token: str, first: int, most: int,
                 budget: int) -> ScriptCall:
    """A page of the parents of the job under `token`: from parent `first`, at most
    `most` of them and `budget` bytes of results and reasons (at least one parent)."""
    return ScriptCall("parents", (keys.active,), (keys.prefix, job_id, token, first, most,
                                                  budget))


def parse_parents(reply: Sequence[Any]) -> ParentsPage:
    if reply and reply[0] in ("lost", "expired"):
        return ParentsPage(str(reply[0]), 0, -1, [])
    return ParentsPage("ok", int(reply[0]), int(reply[1]),
                       [[str(part) for part in entry] for entry in reply[2:]])
