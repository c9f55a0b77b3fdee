"""Chunks: up to N leased jobs of a chunked task (`task(chunk=N)`) in one child.

Grouping (`group`): the jobs one claim leased (or the jobs held for a slot) are put
in chunks as they are, in claim order, up to N of a task each; nothing waits for a
chunk to fill, so a job alone is a chunk of one and starts as fast as any job.

Every job of a chunk keeps its own lease, in the `LeaseKeeper`, extended with the
others and fenced by its own token in its own report; the child is registered under
each job's id, so a lost lease or a cancel of any of them stops the whole chunk (its
process may be running that job right now). The chunk's time limit is the longest of
its jobs', its memory limit the largest: one process, one limit.

Each job ends on its own (`outcomes`): a job the child reported (`ChunkReader`) ends
as reported, whatever happens to the process after; the jobs it did not report end
as the process did — a crash (expired, retried up to max_crashes), a timeout or a
memory limit (a failed attempt each), a drain (released). A stop for one job's sake
is that job's alone: its lease lost (dropped) or its cancel (cancelled); the other
jobs not reported are released, nothing counted.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from forq.queue import Lease
from forq.supervisor.children.chunk_reader import ChunkReader
from forq.supervisor.children.outcomes import Kind, Outcome, classify, from_report
from forq.supervisor.children.output import OutputReader
from forq.supervisor.children.running import KillReason, RunningChild
from forq.supervisor.fork.child import ChildSpec
from forq.supervisor.fork.protocol import TaskInfo

log = logging.getLogger("forq.supervisor")


def size(info: TaskInfo | None) -> int:
    """How many jobs of a task one child runs (1 unless it is chunked)."""
    return info.chunk if info is not None else 1


class ClaimWidth:
    """How many jobs a queue claims per free slot. No claim can tell which tasks' jobs
    it will lease, so a queue starts at the largest chunk of any registered task
    (`widest`) — a backlog of a chunked task fills its chunks from the first claim —
    and then claims as wide as the chunked tasks its last claim leased: a queue whose
    jobs are not chunked goes back to one per slot after its first claim (what that
    one leased beyond its slots waits, held and extended, for the next free one)."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}  # queue -> the widest chunk its last claim leased

    def per_slot(self, queue: str, tasks: Mapping[str, TaskInfo] | None) -> int:
        most = widest(tasks)
        return min(self.last.get(queue, most), most)

    def seen(self, queue: str, leases: list[Lease], chunk_of: Callable[[str], int]) -> None:
        """A claim of the queue leased `leases` (none: nothing learnt)."""
        if leases:
            self.last[queue] = max(chunk_of(task) for task in {x.job.task for x in leases})


def widest(tasks: Mapping[str, TaskInfo] | None) -> int:
    """The largest chunk of any registered task (1 without chunked tasks)."""
    if not tasks:
        return 1
    cached = _WIDEST.get(id(tasks))
    if cached is None or cached[0] is not tasks:  # a new table (a new fork server)
        cached = (tasks, max((t.chunk for t in tasks.values()), default=1))
        _WIDEST.clear()
        _WIDEST[id(tasks)] = cached
    return cached[1]


_WIDEST: dict[int, tuple[Mapping[str, TaskInfo], int]] = {}


def prepare(spec: ChildSpec, members: list[Lease],
            timeout_of: Callable[[Lease], float]) -> tuple[str, float]:
    """Make the first job's `spec` the chunk's: every job in it, the largest memory
    limit of them; returns the child's title and its time limit (the longest)."""
    spec.chunk = [member(lease) for lease in members]
    spec.memory_limit = max(int(lease.job.fields.get("memory_limit") or 0)
                            for lease in members)
    title = f"forq: chunk of {len(members)} {spec.task} {spec.job_id}"
    return title, max(timeout_of(lease) for lease in members)


def group(leases: Iterable[Lease], chunk_of: Callable[[str], int]) -> list[list[Lease]]:
    """`leases` in claim order as the children to start: a job of a task that is not
    chunked alone, the jobs of a chunked task in chunks of at most its N (a chunk is
    placed where its first job was)."""
    children: list[list[Lease]] = []
    filling: dict[str, list[Lease]] = {}
    for lease in leases:
        size = chunk_of(lease.job.task)
        if size <= 1:
            children.append([lease])
            continue
        chunk = filling.get(lease.job.task)
        if chunk is None or len(chunk) >= size:
            chunk = filling[lease.job.task] = []
            children.append(chunk)
        chunk.append(lease)
    return children


def member(lease: Lease) -> dict[str, Any]:
    """A job of a chunk as its child gets it (`ChildSpec.chunk`)."""
    job = lease.job
    return {"id": job.id, "args": job.args, "kwargs": job.kwargs, "attempts": job.attempts,
            "crashes": job.crashes, "snoozes": job.snoozes,
            "group": job.fields.get("group") or None}


def view(child: RunningChild, lease: Lease, silent: OutputReader | None) -> RunningChild:
    """One job of a chunk, for its report: the chunk's process (its pid, times, peak
    memory, kill reason, reader) with this job's lease and spec; a share of its CPU (the
    chunk's split evenly); its output with the first job's report only (`silent`: the
    others' empty one; None for the first). A shallow copy: a chunk ends in one go."""
    job = lease.job
    one = copy.copy(child)
    one.lease, one.members = lease, []
    one.spec = copy.copy(child.spec)
    spec = one.spec
    spec.job_id, spec.args, spec.kwargs = job.id, job.args, job.kwargs  # chunk: kept
    spec.attempts, spec.crashes = job.attempts, job.crashes
    spec.group = job.fields.get("group") or None
    n = max(1, len(child.members))
    one.cpu_us = (child.cpu_us[0] // n, child.cpu_us[1] // n)
    if silent is not None:
        one.out = silent
    return one


def outcomes(child: RunningChild, status: int) -> list[tuple[RunningChild, Outcome]]:
    """Each job of a chunk that ended, with what to tell Redis about it."""
    reports = child.reader.reports if isinstance(child.reader, ChunkReader) else {}
    rest = classify(child, status)  # the end of the process: for each job not reported
    reason = child.kill_reason
    out = []
    silent = OutputReader(child.job_id, child.task, 0)  # nothing: the first job has it
    for i, lease in enumerate(child.members):
        one = view(child, lease, None if i == 0 else silent)
        job_id = lease.job.id
        report = reports.get(job_id)
        if reason is KillReason.LEASE_LOST and (job_id in child.lost or not child.lost):
            # its lease is not ours (or none can be proven: the fork server fenced them)
            outcome = Outcome(Kind.DROP, "lease_lost", reason="lease lost; result dropped")
        elif reason is KillReason.CANCELLED and job_id in child.cancelled:
            outcome = dataclasses.replace(rest)
        elif report is not None:
            outcome = from_report(child, report)
        elif reason in (KillReason.LEASE_LOST, KillReason.CANCELLED):
            why = "lost its lease" if reason is KillReason.LEASE_LOST else "was cancelled"
            outcome = Outcome(Kind.RELEASE, "released",
                              reason=f"another job of its chunk {why}; not run")
        else:
            outcome = dataclasses.replace(rest)
        out.append((one, outcome))
    kinds = Counter(str(outcome.kind) for _one, outcome in out)
    log.info("chunk of %d %s in pid %d ended: %d reported, %s", len(out), child.task, child.pid,
             len(reports), ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())),
             extra={"job": child.job_id, "task": child.task, "event": "chunk_ended"})
    return out
