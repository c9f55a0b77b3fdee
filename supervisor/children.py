"""Children: the supervisor's running children, from fork to the report of their end.

`start` has a leased job's child forked (`Launcher` decides its spec and cgroup,
`Spawner` forks it), watches its result pipe, and holds its lease in the
`LeaseKeeper`; `ended` (called by the `Spawner` when the child was reaped) classifies
its end and hands an `Outcome` to `on_report`. A job whose task no handler module
registers is never forked: it is reported dead at once.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

from forq.queue import Lease
from forq.supervisor import tracing
from forq.supervisor.launch import Launcher
from forq.supervisor.leases import LeaseKeeper
from forq.supervisor.limits import KILL_GRACE, LimitPolice
from forq.supervisor.loop import EventLoop
from forq.supervisor.metrics import Metrics
from forq.supervisor.outcomes import FailMode, Kind, Outcome, classify
from forq.supervisor.reports import Pending
from forq.supervisor.running import KillReason, RunningChild
from forq.supervisor.spawner import Spawner

log = logging.getLogger("forq.supervisor")


class Children:
    def __init__(self, loop: EventLoop, launcher: Launcher, leases: LeaseKeeper,
                 metrics: Metrics, on_report: Callable[[Pending], None],
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.loop = loop
        self.launcher = launcher
        self.leases = leases
        self.metrics = metrics
        self.on_report = on_report  # a finished child's outcome, for the Reporter
        self.on_change = on_change  # a child started or ended (the process title)
        # a child's pipe was read: its progress or a step may wait for Redis (`JobNotes`)
        self.on_notes: Callable[[RunningChild], None] = lambda _child: None
        self.by_job: dict[str, RunningChild] = {}
        self.running: dict[str, int] = defaultdict(int)  # by queue
        self.spawner = Spawner(loop, self.by_job.values, self.ended)
        # sent_at -> the child's first fencing deadline (`Fencer.first_deadline`)
        self.first_deadline: Callable[[float], float | None] = lambda _sent_at: None
        self.police = LimitPolice(self.kill_after_grace)

    def __len__(self) -> int:
        return len(self.by_job)

    def __iter__(self) -> Iterator[RunningChild]:
        return iter(list(self.by_job.values()))

    def get(self, job_id: str) -> RunningChild | None:
        return self.by_job.get(job_id)

    def free(self, queue: str, concurrency: int) -> int:
        return concurrency - self.running[queue]

    def start(self, queue: str, lease: Lease, sent_at: float) -> None:
        job, f = lease.job, lease.job.fields
        spec = self.launcher.spec(queue, lease)
        if not self.leases.provable(sent_at):
            # this process was stopped (or starved) between the claim and now: the lease
            # may be another supervisor's already, so no child; give it back (fenced)
            log.warning("job %s %s: its lease ran out before its child could start; "
                        "released", job.id, job.task)
            never = RunningChild(lease, spec, 0, -1, -1, time.monotonic(), 0)
            self.on_report(Pending(never, Outcome(Kind.RELEASE, "released",
                                                  reason="lease ran out before the start"),
                                   lease.token))
            return
        if self.spawner.known(job.task) is None:
            log.warning("job %s: unknown task %r: dead", job.id, job.task)
            why = f"unknown task {job.task!r}"
            outcome = Outcome(Kind.FAIL, "dead", mode=FailMode.FATAL, reason=why,
                              error={"type": "UnknownTask", "reason": why,
                                     "message": f"no handler registered for {job.task!r}"})
            never = RunningChild(lease, spec, 0, -1, -1, time.monotonic(), 0)
            self.on_report(Pending(never, outcome, lease.token))
            return
        spec.cgroup = self.launcher.cgroup(job.id, spec.memory_limit)
        spec.traceparent = tracing.TRACER.started(queue, job, lease.token, f.get("owner", ""))
        try:
            child = self.spawner.spawn(lease, spec, title=f"forq: job {job.id} {job.task}",
                                       timeout=self.launcher.timeout(lease),
                                       fence_at=self.first_deadline(sent_at))
        except BaseException as exc:
            self.launcher.discard(spec)
            tracing.TRACER.finished(job.id, lease.token, "not started", None, repr(exc))
            raise
        self.by_job[job.id] = child
        self.running[queue] += 1
        self.leases.add(queue, job.id, lease.token, sent_at)
        self.loop.add_reader(child.pipe, lambda _f, _m: self._on_pipe(child))
        if child.output >= 0:
            self.loop.add_reader(child.output, lambda _f, _m: self._on_output(child))
        waited = None
        if f.get("started_at"):
            waited = max(0, int(f["started_at"]) - max(int(f.get("enqueued_at", 0)),
                                                       int(f.get("run_at", 0)))) / 1000
        self.metrics.job_started(queue, job.task, waited)
        self.metrics.set_children(queue, self.running[queue])
        log.info("job %s %s started in pid %d (attempt %d)", job.id, job.task, child.pid,
                 job.attempts + 1, extra={"job": job.id, "task": job.task, "event": "started"})
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
        if child.pipe_open:
            child.read_pipe()
            self.loop.remove_reader(child.pipe)
        self.on_notes(child)  # a step it sent last is still recorded (before its report)
        job_cgroups = self.launcher.cgroups
        if child.spec.cgroup and job_cgroups is not None:
            # the cgroup's peak is what its limit applied to (a child's ru_maxrss also
            # counts the pages it shares with the fork server, charged to the server)
            child.oom = job_cgroups.oom_cause(child.spec.cgroup)
            child.peak_rss = (job_cgroups.usage(child.spec.cgroup, peak=True)
                              or max(child.peak_rss, peak_rss))
            job_cgroups.remove(child.spec.cgroup)
        else:
            child.peak_rss = max(child.peak_rss, peak_rss)
        if child.output >= 0:
            self.loop.remove_reader(child.output)
            child.close_output()
        child.close_proc()
        os.close(child.pidfd)
        os.close(child.pipe)
        child.pipe, child.pipe_open = -1, False  # a step answered later is not written
        self.by_job.pop(child.job_id, None)
        self.running[child.queue] -= 1
        self.metrics.set_children(child.queue, self.running[child.queue])
        token = self.leases.token(child.job_id) or child.lease.token
        # the lease stays in the keeper (and is extended) until the report lands: a
        # result waiting out a Redis blip must not expire and be run again elsewhere
        outcome = classify(child, status)
        if outcome.kind is Kind.FAIL and outcome.error.get("type") == "MemoryError":
            outcome.metric = "memory"
        if outcome.kind is Kind.EXPIRE and cause:
            outcome.reason = f"{cause}: {outcome.reason}"
        if outcome.kind is Kind.RELEASE and child.kill_reason is None:
            # a release the child caused itself: it could not join its cgroup
            self.launcher.child_could_not_join(child.job_id, child.spec.cgroup)
        self.on_report(Pending(child, outcome, token))
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
