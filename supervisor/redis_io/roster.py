"""The roster of live supervisors: each supervisor's own record, written every heartbeat
(read by `forq.fleet` for `forq supervisors`, `forq web` and the "no supervisor" alert).

A hash field per supervisor holds a JSON record refreshed every heartbeat; readers
judge liveness by the heartbeat's age in Redis time, so no clock but Redis's matters.
The record carries what the supervisor knows of its running children (`running_record`),
so the dashboard's "running now" costs one write per heartbeat, whatever the job rate.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import redis

from forq.fleet import redis_now
from forq.store.keys import SUPERVISORS

if TYPE_CHECKING:
    from forq.supervisor.children.running import RunningChild
    from forq.supervisor.leases.keeper import LeaseKeeper

VERSION = "0.2.0"  # pyproject.toml's version (tests/test_defaults.py checks)
MAX_CHILDREN_LISTED = 1000  # a heartbeat record stays small whatever the concurrency


class Roster:
    def __init__(self, client: redis.Redis, supervisor_id: str) -> None:
        self.client = client
        self.id = supervisor_id
        self.started = time.time()

    def beat(self, record: dict[str, Any]) -> None:
        now = redis_now(self.client)
        record = dict(record, id=self.id, version=VERSION, heartbeat=now,
                      started=self.started)
        self.client.hset(SUPERVISORS, self.id, json.dumps(record))

    def leave(self) -> None:
        self.client.hdel(SUPERVISORS, self.id)


def running_record(children: Iterable[RunningChild], leases: LeaseKeeper, *,
                   per_job_cgroups: bool, held: Sequence[str] = ()) -> dict[str, Any]:
    """What the heartbeat says about running children, for the dashboard's "running now".

    Times are durations at the moment of the beat (elapsed, lease left), not clock
    readings: a reader adds the heartbeat's age in Redis time, so this machine's clock
    never matters. Each child is a short list (id, queue, task, pid, elapsed s, timeout
    s, peak RSS bytes, memory limit bytes, lease left s) to keep the record compact.
    `held`: the ids of jobs leased ahead of a free slot (a queue's prefetch), no child yet.
    `children_usage`, in the order of `children` (a list of its own, so that readers of
    the rows above need no change): [CPU s so far, CPU % since the last beat, RSS bytes
    at the last sample] each, the CPU figures null when they cannot be read (`forq top`).
    A chunk's jobs are a row each (one pid), its CPU figures on the first job's row.
    """
    now = time.monotonic()
    listed: list[list[Any]] = []
    usage: list[list[Any]] = []
    total = 0
    for child in children:
        # a chunk (`task(chunk=N)`) is a row per job, each with its own lease; the
        # process's CPU on its first job's row only, so that no reader counts it twice
        job_ids = [lease.job.id for lease in child.members] or [child.job_id]
        total += len(job_ids)
        if len(listed) >= MAX_CHILDREN_LISTED:
            continue
        cpu = child.cpu_since_seen(now)
        for n, job_id in enumerate(job_ids[:MAX_CHILDREN_LISTED - len(listed)]):
            proven = leases.proven_until(job_id)
            listed.append([
                job_id, child.queue, child.task, child.pid,
                round(now - child.started, 3), round(child.deadline - child.started, 3),
                child.peak_rss, child.spec.memory_limit,
                round(proven - now, 3) if proven is not None else None,
            ])
            usage.append([round(cpu[0], 3), round(cpu[1], 1), child.rss]
                         if cpu is not None and n == 0 else [None, None, child.rss])
    return {"memory_mode": "cgroups" if per_job_cgroups else "rss",
            "children": listed, "children_usage": usage, "children_total": total,
            "held": list(held[:MAX_CHILDREN_LISTED])}
