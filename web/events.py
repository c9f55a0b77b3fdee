"""The dashboard's use of the queues' event streams (lua/includes/events.lua): a page of
a queue's recent events, and the marker that tells a live view nothing happened since
it was last rendered, so it is not rendered (nor sent) again for nothing.

A live view (the overview, "running now") is rendered once per refresh period while
anything happens, and at most every `IDLE_REFRESH` s while nothing does: the marker is
each queue's newest event id and its settings hash (a pause, a new limit), and the set
of live supervisors, three commands a queue instead of the view's dozens. A queue
whose events are off, or "running now" while jobs run (their elapsed time and lease
countdown move by themselves), has no marker: the view is rendered every period.
"""

from __future__ import annotations

from typing import Any

import redis

from forq import known_queues
from forq.store.events import KINDS, QueueEvent, entries_kept, parse_entry
from forq.store.keys import SUPERVISORS, QueueKeys

IDLE_REFRESH = 3.0  # s: a live view nothing happened to is rendered again this often
PAGE = 100  # events on a page
SCAN_CAP = 2000  # entries read to fill a filtered page: bounded work per page


def live_marker(client: redis.Redis, view: str) -> tuple[Any, ...] | None:
    """What the live `view` depends on that only changes when something happens, or
    None when the view must be rendered anyway."""
    names = known_queues(client)
    pipe = client.pipeline(transaction=False)
    for name in names:
        keys = QueueKeys(name)
        pipe.hgetall(keys.limits)
        pipe.xrevrange(keys.events, "+", "-", count=1)
        pipe.zcard(keys.active)
    pipe.hkeys(SUPERVISORS)
    replies = pipe.execute()
    marker: list[Any] = [tuple(sorted(replies[-1]))]
    for i, name in enumerate(names):
        limits, newest, active = replies[3 * i:3 * i + 3]
        if entries_kept(limits.get("events")) == 0 or (view == "running" and active):
            return None
        marker.append((name, tuple(sorted(limits.items())), newest[0][0] if newest else None))
    return tuple(marker)


def queue_events(client: redis.Redis, queue: str, *, before: str | None = None,
                 kind: str | None = None, job: str | None = None) -> dict[str, Any]:
    """The newest `PAGE` events of `queue` (before the stream id `before`, if given),
    newest first, of one kind and one job if asked; reads at most SCAN_CAP entries, and
    says where to go on (`older`: a stream id, or None at the end)."""
    keys = QueueKeys(queue)
    if kind is not None and kind not in KINDS:
        raise ValueError(f"no kind of event {kind!r} (one of {', '.join(KINDS)})")
    rows: list[QueueEvent] = []
    cursor = f"({before}" if before else "+"
    read = 0
    older: str | None = None
    while len(rows) < PAGE and read < SCAN_CAP:
        entries = client.xrevrange(keys.events, cursor, "-", count=PAGE)
        if not entries:
            older = None
            break
        read += len(entries)
        for entry in entries:
            event = parse_entry(queue, entry)
            older = event.stream_id
            if (kind is None or event.kind == kind) and (job is None or event.job_id == job):
                rows.append(event)
                if len(rows) == PAGE:
                    break
        cursor = f"({older}"
        if len(entries) < PAGE and len(rows) < PAGE:
            older = None
            break
    settings = client.hmget(keys.limits, "events", "on_dead")
    return {"queue": queue, "events": rows, "older": older, "kind": kind, "job": job,
            "kinds": KINDS, "on": entries_kept(settings[0]) > 0, "on_dead": settings[1],
            "length": client.xlen(keys.events)}
