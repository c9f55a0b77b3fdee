"""Children: the supervisor's running children, from fork to the report of their end.

`start` has a leased job's child forked (`Launcher` decides its spec and cgroup,
`Spawner` forks it), watches its result pipe, and holds its lease in the
`LeaseKeeper`; `ended` (called by the `Spawner` when the child was reaped) classifies
its end and hands an `Outcome` to `on_report`. A job whose task no handler module
registers is never forked: it is reported dead at once. A job leased while its queue's
slots are full (its `prefetch`) waits in `held` and starts when a child of that queue
ends (`supervisor/leases/held.py`). With a `memory_budget`, a job also waits, held,
until its memory limit fits beside the running children's (`MemoryBudget`).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator

from forq.queue import Lease
from forq.supervisor.children import chunks
from forq.supervisor.children.budget import RESERVE_AFTER, MemoryBudget, refusal
from forq.supervisor.children.launch import Launcher
from forq.supervisor.children.outcomes import FailMode, Kind, Outcome, classify
from forq.supervisor.children.running import KillReason, RunningChild
from forq.supervisor.children.spawner import Spawner
from forq.supervisor.config.load import QueueConfig
from forq.supervisor.isolation.limits import KILL_GRACE, LimitPolice
from forq.supervisor.leases.held import AUTO_PREFETCH, HeldLeases, ShortJobs
from forq.supervisor.leases.keeper import LeaseKeeper
from forq.supervisor.loop.eventloop import EventLoop
from forq.supervisor.observe import tracing
from forq.supervisor.observe.metrics import Metrics
from forq.supervisor.observe.metrics_memory import MemorySnapshot
from forq.supervisor.redis_io.reports import Pending

log = logging.getLogger("forq.supervisor")


class Children:
    def __init__(self, loop: EventLoop, launcher: Launcher, spawner: Spawner,
                 leases: LeaseKeeper, held: HeldLeases, metrics: Metrics, *,
                 on_report: Callable[[Pending], None],
                 on_notes: Callable[[RunningChild], None],
                 first_deadline: Callable[[float], float | None],
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.loop = loop
        self.launcher = launcher
        self.spawner = spawner  # forks each child; calls `ended` when one is reaped
        self.leases = leases
        self.held = held
        self.metrics = metrics
        self.on_report = on_report  # a finished child's outcome, for the Reporter
        # a child's pipe was read: its progress or a step may wait for Redis (`JobNotes`)
        self.on_notes = on_notes
        # sent_at -> the child's first fencing deadline (`Fencer.first_deadline`)
        self.first_deadline = first_deadline
        self.on_change = on_change  # a child started or ended (the process title)
        self.by_job: dict[str, RunningChild] = {}
        self.running: dict[str, int] = defaultdict(int)  # by queue
        self.police = LimitPolice(self.kill_after_grace)
        self.slots: dict[str, tuple[int, int]] = {}  # queue -> (concurrency, prefetch)
        self.short_jobs = ShortJobs()  # queues with prefetch = "auto": are their jobs short
        self.budget = MemoryBudget()  # [supervisor] memory_budget: admission by memory
        # how many jobs of a task one child runs (`task(chunk=N)`; 1 unless chunked)
        self.chunk_of = lambda task: chunks.size(spawner.task_info(task))
        self.claim_width = chunks.ClaimWidth()  # jobs claimed per free slot

    def __len__(self) -> int:
        return len(self.unique())

    def __iter__(self) -> Iterator[RunningChild]:
        return iter(self.unique())

    def unique(self) -> list[RunningChild]:
        """Each running child once (a chunk's is under each of its jobs' ids)."""
        return list({id(c): c for c in self.by_job.values()}.values())

    def get(self, job_id: str) -> RunningChild | None:
        return self.by_job.get(job_id)

    def configure(self, queues: Iterable[QueueConfig], memory_budget: int | None = None,
                  reserve_after: float = RESERVE_AFTER) -> None:
        """At start and on reload: each queue's slots and the memory budget. Held jobs
        beyond a queue's new prefetch and free slots (all of a queue no longer served)
        are given back now."""
        queues = list(queues)
        self.slots = {qc.name: (qc.concurrency, AUTO_PREFETCH if qc.prefetch == "auto"
                                else int(qc.prefetch)) for qc in queues}
        self.short_jobs.configure(qc.name for qc in queues if qc.prefetch == "auto")
        self.budget.configure(memory_budget, reserve_after)
        # a lower budget: a held job over it would wait for room forever
        over = [lease.job.id for lease in self.held.every() if self.budget.over(self._cost(lease))]
        for queue, lease in self.held.take(over):
            self._refuse(queue, lease)

        def allowed(q: str) -> int:
            concurrency, prefetch = self.slots.get(q, (0, 0))
            return prefetch + max(0, concurrency - self.running[q])

        for queue, lease in self.held.trim(allowed):
            self._give_back(queue, lease, "prefetch lowered or queue no longer served")
        for queue in self.slots:
            self._start_held(queue)  # a reload that added slots: held jobs take them first
            # after `Metrics.declare_queue`, which zeroes them
            self.metrics.set_children(queue, self.running[queue])
            self.metrics.set_held(queue, self.held.count(queue))

    def free(self, queue: str) -> int:
        """How many jobs to claim for the queue: free slots, plus the prefetch not held,
        as far as the memory budget has room. Jobs held for memory (up to one per slot)
        take no slot: the smaller jobs behind them still run."""
        concurrency, prefetch = self.slots[queue]
        prefetch = self.short_jobs.prefetch(queue, prefetch)
        held = self.held.count(queue) - min(self.budget.waiters(queue), concurrency)
        # a chunked task takes up to N jobs per slot: claim that many per free slot
        wide = self.claim_width.per_slot(queue, self.spawner.tasks)
        free = max(0, (concurrency - self.running[queue]) * wide + prefetch - held)
        if free == 0 or self.budget.budget is None:
            return free
        held_cost = sum(self._cost(lease) for lease in self.held.every()
                        if lease.job.id not in self.budget.waiting)
        room = self.budget.claimable(queue, held_cost, time.monotonic())
        return free if room is None else min(free, room)

    def memory(self) -> MemorySnapshot:
        """The memory budget's figures now, for the metrics endpoint."""
        held = sum(self._cost(lease) for lease in self.held.every())
        return self.budget.snapshot(held, self.slots)

    def _cost(self, lease: Lease) -> int:
        return self.budget.cost(int(lease.job.fields.get("memory_limit") or 0), lease.job.task)

    def _fits(self, queue: str, lease: Lease) -> bool:
        return self.budget.admits(lease.job.id, queue, self._cost(lease), time.monotonic())

    def start_all(self, queue: str, leases: list[Lease], sent_at: float) -> None:
        """The jobs a claim sent at `sent_at` leased, a chunked task's in chunks."""
        self.claim_width.seen(queue, leases, self.chunk_of)
        for chunk in chunks.group(leases, self.chunk_of):
            self.start(queue, chunk[0], sent_at, chunk)

    def start(self, queue: str, lease: Lease, sent_at: float,
              members: list[Lease] | None = None) -> None:
        """A job (or the chunk `members`, `lease` first) just leased by a claim sent at
        `sent_at`: its child now, or held for the queue's next free slot."""
        every = members or [lease]
        if queue not in self.slots:  # not served since a reload: nothing would start it
            for one in every:
                self._give_back(queue, one, "queue no longer served")
        elif self.budget.over(self._cost(lease)):
            for one in every:
                self._refuse(queue, one)
        elif self.running[queue] >= self.slots[queue][0] or not self._fits(queue, lease):
            for one in every:
                self.held.hold(queue, one, sent_at)
        else:
            self._start(queue, lease, sent_at, members)

    def _start_held(self, queue: str) -> None:
        concurrency, _ = self.slots.get(queue, (0, 0))
        while self.running[queue] < concurrency:
            lease = self.held.next(queue, lambda held: self._fits(queue, held))
            if lease is None:
                return
            every = [lease, *self.held.more_of(queue, lease, self.chunk_of)]
            proven = [(one, self.held.proven_since(one)) for one in every]
            for one, at in proven:
                if at is None:  # fenced while held: the lease may be someone else's now
                    self._give_back(queue, one, "lease not proven while held")
            every = [one for one, at in proven if at is not None]
            if every:
                sent_at = min(at for _one, at in proven if at is not None)
                self._start(queue, every[0], sent_at, every)

    def _give_back(self, queue: str, lease: Lease, why: str) -> None:
        """Release a lease whose job never started (fenced by its token: a lease
        another supervisor holds by now is answered "lost" and nothing changes)."""
        log.info("job %s %s: not started, released (%s)", lease.job.id, lease.job.task, why,
                 extra={"job": lease.job.id, "task": lease.job.task, "event": "released"})
        self._never_started(queue, lease, Outcome(Kind.RELEASE, "released", reason=why))

    def _refuse(self, queue: str, lease: Lease) -> None:
        job = lease.job
        why = self.budget.refuse(job.id, queue, job.task, self._cost(lease), time.monotonic())
        log.warning("job %s %s: %s; snoozed", job.id, job.task, why,
                    extra={"job": job.id, "task": job.task, "event": "over_memory_budget"})
        self._never_started(queue, lease, refusal(job.snoozes, why))

    def _never_started(self, queue: str, lease: Lease, outcome: Outcome) -> None:
        self.budget.forget(lease.job.id)
        never = RunningChild(lease, self.launcher.spec(queue, lease), 0, -1, -1,
                             time.monotonic(), 0)
        self.on_report(Pending(never, outcome, lease.token))

    def release_held(self, job_ids: Collection[str] | None, why: str) -> None:
        """Give back held jobs now: these (cancelled ones, which `release` ends as
        cancelled), or all (drain)."""
        taken = (self.held.take(job_ids) if job_ids is not None
                 else self.held.trim(lambda _q: 0))
        for queue, lease in taken:
            self._give_back(queue, lease, why)

    def forget_held(self, job_ids: Collection[str]) -> None:
        """Redis answered these leases lost: another supervisor has the job now."""
        for _queue, lease in self.held.take(job_ids):
            log.warning("job %s %s: held lease lost; not started", lease.job.id,
                        lease.job.task)
            self.budget.forget(lease.job.id)
            self.leases.remove(lease.job.id)

    def _start(self, queue: str, lease: Lease, sent_at: float,
               members: list[Lease] | None = None) -> None:
        job, f = lease.job, lease.job.fields
        # a chunked task's job alone is a chunk of one: its handler takes a list
        members = (members or [lease]) if self.chunk_of(job.task) > 1 else None
        every = members or [lease]
        if not self.leases.provable(sent_at):
            # this process was stopped (or starved) between the claim and now: the lease
            # may be another supervisor's already, so no child; give it back (fenced)
            log.warning("job %s %s: its lease ran out before its child could start; "
                        "released", job.id, job.task)
            for one in every:
                self._never_started(queue, one, Outcome(
                    Kind.RELEASE, "released", reason="lease ran out before the start"))
            return
        if self.spawner.known(job.task) is None:
            log.warning("job %s: unknown task %r: dead", job.id, job.task)
            why = f"unknown task {job.task!r}"
            self._never_started(queue, lease, Outcome(
                Kind.FAIL, "dead", mode=FailMode.FATAL, reason=why,
                error={"type": "UnknownTask", "reason": why,
                       "message": f"no handler registered for {job.task!r}"}))
            return
        spec = self.launcher.spec(queue, lease)
        title, timeout = f"forq: job {job.id} {job.task}", self.launcher.timeout(lease)
        if members:  # one child for all: the longest time limit, the largest memory limit
            title, timeout = chunks.prepare(spec, members, self.launcher.timeout)
        spec.cgroup = self.launcher.cgroup(job.id, spec.memory_limit)
        spec.traceparent = tracing.TRACER.started(queue, job, lease.token, f.get("owner", ""))
        for one in every[1:]:
            tracing.TRACER.started(queue, one.job, one.token, one.job.fields.get("owner", ""))
        try:
            child = self.spawner.spawn(lease, spec, title=title, timeout=timeout,
                                       fence_at=self.first_deadline(sent_at))
        except BaseException as exc:
            self.launcher.discard(spec)
            for one in every:
                tracing.TRACER.finished(one.job.id, one.token, "not started", None, repr(exc))
            raise
        child.claimed, child.members = sent_at, members or []
        self.running[queue] += 1
        self.budget.started(job.id, spec.memory_limit if members else
                            int(f.get("memory_limit") or 0))
        for one in every:  # each job's lease kept and fenced on its own
            self.by_job[one.job.id] = child
            self.leases.add(queue, one.job.id, one.token, sent_at)
        self.loop.add_reader(child.pipe, lambda _f, _m: self._on_pipe(child))
        if child.output >= 0:
            self.loop.add_reader(child.output, lambda _f, _m: self._on_output(child))
        _started(self.metrics, queue, every, child.pid, chunk=bool(members))
        self.metrics.set_children(queue, self.running[queue])
        self.on_change()

    def _on_pipe(self, child: RunningChild) -> None:
        more = child.read_pipe()
        self.on_notes(child)
        if not more:
            self.loop.remove_reader(child.pipe)
            child.pipe_open = False
            if child.reader.done and child.kill_reason is None:
                # nothing it says from now on can be used: stop it now, not at its time limit
                log.warning("job %s %s: %s; killing its child", child.job_id, child.task,
                            child.reader.violation or "result too large")
                child.stop(KillReason.PROTOCOL, grace=0)

    def _on_output(self, child: RunningChild) -> None:
        if child.output < 0:  # closed earlier in this loop turn (the child ended)
            return
        if not child.out.read(child.output):  # EOF: every process of the job closed it
            self.loop.remove_reader(child.output)
            os.close(child.output)
            child.output = -1

    def ended(self, child: RunningChild, status: int, peak_rss: int, cause: str = "") -> None:
        """A child was reaped (here, or by the fork server, which killed its group first).
        `cause`: what is known beyond its status, said in the reason of a crash."""
        child.ended = time.monotonic()
        if child.pipe_open:
            child.read_pipe()
            self.loop.remove_reader(child.pipe)
        self.on_notes(child)  # a step it sent last is still recorded (before its report)
        if child.output >= 0:
            self.loop.remove_reader(child.output)
        child.close_after_exit(self.launcher.cgroups, peak_rss)
        for lease in child.members or [child.lease]:
            self.by_job.pop(lease.job.id, None)
        self.running[child.queue] -= 1
        self.budget.ended(child.job_id)
        self.metrics.set_children(child.queue, self.running[child.queue])
        self.short_jobs.ended(child.queue, time.monotonic() - child.started)
        # the lease stays in the keeper (and is extended) until the report lands: a
        # result waiting out a Redis blip must not expire and be run again elsewhere
        ends = (chunks.outcomes(child, status) if child.members
                else [(child, classify(child, status))])
        for job, outcome in ends:
            _refine(outcome, cause)
            if outcome.kind is Kind.RELEASE and child.kill_reason is None:
                # a release the child caused itself: it could not join its cgroup
                self.launcher.child_could_not_join(job.job_id, child.spec.cgroup)
        # the slot's next job first: its fork overlaps this report's round trip; the
        # memory it freed may start a job held in another queue
        self._start_held(child.queue)
        if self.budget.budget is not None:
            for queue in self.slots:
                self._start_held(queue)
        for job, outcome in ends:
            token = self.leases.token(job.job_id) or job.lease.token
            self.on_report(Pending(job, outcome, token))
        self.on_change()

    def kill_after_grace(self, child: RunningChild) -> None:
        def kill() -> None:
            if self.by_job.get(child.job_id) is child:
                child.signal_group(signal.SIGKILL)

        self.loop.timers.schedule(KILL_GRACE, kill)

    def stop_all(self, why: str) -> None:
        """Drain's end: every child stops (SIGTERM, then SIGKILL), its lease released."""
        for child in self:
            child.stop(KillReason.RELEASED, why, grace=KILL_GRACE)
            self.kill_after_grace(child)

    def police_limits(self) -> None:
        if self.launcher.cgroups is not None:
            self.launcher.cgroups.sweep()
        self.police.tick(self)


def _refine(outcome: Outcome, cause: str) -> None:
    """What the parent knows beyond a child's report: its MemoryError is the memory
    metric's; `cause`, what is known beyond its status, goes in a crash's reason."""
    if outcome.kind is Kind.FAIL and outcome.error.get("type") == "MemoryError":
        outcome.metric = "memory"
    if outcome.kind is Kind.EXPIRE and cause:
        outcome.reason = f"{cause}: {outcome.reason}"


def _started(metrics: Metrics, queue: str, every: list[Lease], pid: int, chunk: bool) -> None:
    """The news of a child's start: each job's wait, and a log line (one for a chunk)."""
    for lease in every:
        f = lease.job.fields
        waited = None
        if f.get("started_at"):
            waited = max(0, int(f["started_at"]) - max(int(f.get("enqueued_at", 0)),
                                                       int(f.get("run_at", 0)))) / 1000
        metrics.job_started(queue, lease.job.task, waited)
    job = every[0].job
    if chunk:
        log.info("chunk of %d %s started in pid %d: %s", len(every), job.task, pid,
                 " ".join(lease.job.id for lease in every),
                 extra={"job": job.id, "task": job.task, "event": "started"})
    else:
        log.info("job %s %s started in pid %d (attempt %d)", job.id, job.task, pid,
                 job.attempts + 1, extra={"job": job.id, "task": job.task, "event": "started"})
