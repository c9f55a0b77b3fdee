"""Fencer: stop every child whose lease this supervisor no longer holds.

Three ways a lease is lost: Redis answers an extension "lost" (another supervisor's
reaper took the job after our lease expired), the job was cancelled, or this
supervisor cannot prove it still holds the lease (its last confirmed extension is
older than the TTL, minus a margin: Redis unreachable, or this process was stopped).
In each case the child is killed at once and its result dropped, before anyone else
can run the job: an extension and a reclaim never both win.

A deliberately broken build (the chaos checker's self-test) replaces this class.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from forq.supervisor.children.running import KillReason, RunningChild
from forq.supervisor.leases.keeper import LeaseKeeper

log = logging.getLogger("forq.supervisor")


class Fencer:
    def __init__(self, leases: LeaseKeeper, children: Mapping[str, RunningChild]) -> None:
        self.leases = leases
        self.children = children  # by job id

    def lost(self, job_ids: Iterable[str]) -> None:
        """Redis answered "lost" for these leases."""
        for job_id in job_ids:
            child = self.children.get(job_id)
            if child is not None:
                log.warning("job %s %s: lease lost, killing its child (fencing)", job_id,
                            child.task)
                child.lost.add(job_id)  # a chunk's other jobs are released, not dropped
                child.stop(KillReason.LEASE_LOST, grace=0)

    def cancelled(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            child = self.children.get(job_id)
            if child is not None:
                log.info("job %s %s: cancelled, stopping its child", job_id, child.task)
                child.cancelled.add(job_id)
                child.stop(KillReason.CANCELLED, grace=0)

    def first_deadline(self, sent_at: float) -> float | None:
        """The fencing deadline of a lease claimed by a call sent at `sent_at` (monotonic):
        the fork server kills the child then unless `deadlines` moves it on."""
        return sent_at + self.leases.ttl - self.leases.margin

    def deadlines(self) -> list[tuple[RunningChild, float]]:
        """Each child's fencing deadline after a confirmed extension: when its lease stops
        being proven (what `unproven` goes by); a chunk's, when the first of its jobs'
        leases does."""
        out: dict[int, tuple[RunningChild, float]] = {}
        for job_id, child in self.children.items():
            at = self.leases.fence_at(job_id)
            if at is not None and (id(child) not in out or at < out[id(child)][1]):
                out[id(child)] = (child, at)
        return list(out.values())

    def unproven(self) -> None:
        """Kill any child whose lease can no longer be proven, before another
        supervisor's reaper can hand the job to someone else."""
        for job_id in self.leases.unproven():
            child = self.children.get(job_id)
            if child is not None:
                child.lost.add(job_id)
            if child is not None and child.kill_reason is not KillReason.LEASE_LOST:
                log.warning("job %s %s: lease not confirmed in time, killing its child",
                            job_id, child.task)
                child.stop(KillReason.LEASE_LOST, grace=0)
            self.leases.remove(job_id)
