"""LimitPolice: each child's time limit and memory limit, checked on one tick.

One tick for all children every `memory_sample_interval`, rather than a timer per
child (which would keep each finished child alive until its time limit). A child over
its time limit gets SIGTERM, then SIGKILL after `KILL_GRACE`; one over its memory limit
(RSS of its whole process tree) gets SIGKILL at once. In a per-job cgroup the kernel
enforces the memory limit itself, and the tick only records the peak. A sample that
cannot be taken is skipped and said once per job, never counted as nothing; a job that
makes its memory impossible to count (`shared_memory.Unmeasurable`) is killed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from forq.supervisor.children.running import KillReason, RunningChild
from forq.supervisor.isolation.cgroups import JobCgroups
from forq.supervisor.isolation.shared_memory import SampleError, Unmeasurable

log = logging.getLogger("forq.supervisor")

KILL_GRACE = 2.0  # SIGTERM → SIGKILL for time limits, drains and cancels
# Memory samples per tick, at most: reading a process tree's RSS is a few /proc reads,
# 30% of a core for 1,000 children every 50 ms. Past this many children each is sampled
# every (children / SAMPLES_PER_TICK) ticks, in turn; the address-space rlimit stays
# the backstop between samples, and time limits are still checked for all on each tick.
SAMPLES_PER_TICK = 64


class LimitPolice:
    def __init__(self, kill_after_grace: Callable[[RunningChild], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kill_after_grace = kill_after_grace  # SIGKILL it KILL_GRACE from now
        self.clock = clock
        self.turn = 0  # where this tick's memory samples start, in the children's order

    def tick(self, children: Iterable[RunningChild]) -> None:
        now = self.clock()
        children = list(children)
        count = len(children)
        if count > SAMPLES_PER_TICK:
            start, self.turn = self.turn % count, self.turn + SAMPLES_PER_TICK
        else:
            start = 0
        for index, child in enumerate(children):
            sampled = (index - start) % count < SAMPLES_PER_TICK
            if now >= child.deadline and child.kill_reason is None:
                if child.forked_by_server and not child.alive():
                    continue  # exited: its pid may be reaped, and reused, before its report
                timeout = child.deadline - child.started
                log.info("job %s %s: time limit %.3gs reached, stopping", child.job_id,
                         child.task, timeout)
                child.stop(KillReason.TIMEOUT, f"{timeout:g}s", grace=KILL_GRACE)
                self.kill_after_grace(child)
            if not sampled:
                continue
            if child.spec.cgroup:  # the kernel enforces its limit: keep the peak only
                charged = JobCgroups.usage(child.spec.cgroup)
                if charged is not None:  # unreadable: no sample, never a 0
                    child.rss, child.peak_rss = charged, max(child.peak_rss, charged)
                    if charged:  # a cgroup emptied as the job exits reads 0
                        child.trail.add(now, charged)
                continue
            try:
                usage = child.tree_usage()
            except Unmeasurable as exc:
                if child.kill_reason is None:
                    log.info("job %s %s: %s, killing", child.job_id, child.task, exc)
                    child.stop(KillReason.UNMEASURABLE, str(exc), grace=0)
                continue
            except SampleError as exc:  # not a zero: this sample is skipped, and said
                if not child.sample_failed:
                    child.sample_failed = True
                    log.warning("job %s %s: a memory sample could not be taken (%s); "
                                "skipped, not counted as nothing", child.job_id,
                                child.task, exc)
                continue
            if usage is None:
                continue  # exited
            processes, rss = usage
            child.rss, child.peak_rss = rss, max(child.peak_rss, rss)
            if rss:  # a zombie (its end not yet reaped) reads 0: not its memory
                child.trail.add(now, rss)
            most = child.spec.max_processes
            if most and processes > most + 1 and child.kill_reason is None:
                # +1: the waiter of a job in its own PID namespace. Where the kernel
                # enforces the limit (RLIMIT_NPROC in the job's user namespace, pids.max)
                # it is never reached; elsewhere this is the limit, after the fact
                log.info("job %s %s: %d processes, over max_processes %d, killing",
                         child.job_id, child.task, processes, most)
                child.stop(KillReason.PROCESSES, f"{processes} > {most}", grace=0)
                continue
            limit = child.spec.memory_limit
            if limit and rss > limit and child.kill_reason is None:
                log.info("job %s %s: memory %d MiB over its limit %d MiB, killing",
                         child.job_id, child.task, rss >> 20, limit >> 20)
                child.stop(KillReason.MEMORY, f"{limit / (1 << 20):.0f} MiB", grace=0)
