"""What a child's end means: the parent's kill reason, the child's report or its exit
status become one `Outcome` to tell Redis (ack, fail, expire, release or drop)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from forq.supervisor.children.running import KillReason, RunningChild
from forq.supervisor.fork.messages import Report
from forq.supervisor.isolation.cgroups import JOIN_FAILED


class Kind(str, Enum):
    """Which transition reports a child's end to Redis (one Lua script each)."""

    ACK = "ack"  # it returned: succeeded
    FAIL = "fail"  # it raised, or broke a limit: an attempt counted (retry or dead)
    EXPIRE = "expire"  # it crashed: a crash counted, reclaimed at once
    RELEASE = "release"  # given back unfinished: nothing counted
    THROTTLE = "throttle"  # the handler throttled its queue or group: back to wait
    DROP = "drop"  # the lease was lost: nothing to say, the new holder decides

    def __str__(self) -> str:
        return self.value


class FailMode(str, Enum):
    """What `fail` does with the attempt (fail.lua's ARGV[4])."""

    RETRY = "retry"  # retry after backoff while attempts remain
    FATAL = "fatal"  # dead now (NonRetryable, unknown task, result too large)
    CANCEL = "cancel"  # cancelled on request
    SNOOZE = "snooze"  # the handler's own `Retry`: again after its delay (max_snoozes)

    def __str__(self) -> str:
        return self.value


#: the ``outcome`` label of forq_jobs_finished_total (`metrics.OUTCOMES`)
Metric = Literal["succeeded", "retried", "dead", "failed", "timeout", "memory", "crashed",
                 "lease_lost", "released", "cancelled", "snoozed", "throttled"]


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)} without a result"


@dataclass
class Outcome:
    """What the parent will tell Redis about a finished child."""

    kind: Kind
    metric: Metric  # refined once fail's reply says retried or dead
    result_json: str = "null"
    followups: list[dict[str, Any]] = field(default_factory=list)
    batch: dict[str, Any] | None = None  # the batch the handler opened (messages.Report)
    error: dict[str, Any] = field(default_factory=dict)
    mode: FailMode = FailMode.RETRY
    reason: str = ""
    # a snooze's (mode SNOOZE) or a throttle's delay, ms (a throttle's cut to the queue's
    # max_throttle); a snooze counted as an attempt; a throttle of the job's group
    delay_ms: int = 0
    counted: bool = False
    group: bool = False
    # how it ended, for its task's circuit breaker (lua/includes/breaker.lua): the
    # parent's own observation, "" for an end that is no fault of the task
    pattern: str = ""


#: the longest exception type a pattern keeps: the type's name is the child's word
PATTERN_TYPE_MAX = 64


def exception_pattern(error: dict[str, Any]) -> str:
    """The breaker's pattern of a handler's exception: its type as the child reported
    it, which a hostile child chooses; so only the characters of a dotted Python name
    and at most PATTERN_TYPE_MAX of them (it names only how its own task's jobs end)."""
    kind = "".join(c for c in str(error.get("type") or "")[:PATTERN_TYPE_MAX]
                   if c.isascii() and (c.isalnum() or c in "._"))
    return f"exception:{kind or '?'}"


def status_pattern(status: int) -> str:
    """The breaker's pattern of a child that died without a result: its signal, or its
    exit code (from waitpid, the kernel's word, not the child's)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return f"signal:{signal.Signals(sig).name}"
        except ValueError:
            return f"signal:{sig}"
    return f"exit:{os.waitstatus_to_exitcode(status)}"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def classify(child: RunningChild, status: int) -> Outcome:
    """Exit classification: a report → ack or fail; our own kill → its reason;
    anything else (a signal, an exit without a report, the OOM killer) → a crash."""
    peak = f"peak RSS {_mib(child.peak_rss)}"
    reason = child.kill_reason
    if reason == KillReason.LEASE_LOST:
        return Outcome(Kind.DROP, "lease_lost", reason="lease lost; result dropped")
    if reason == KillReason.RELEASED:
        return Outcome(Kind.RELEASE, "released", reason=child.kill_detail or "drain")
    if reason == KillReason.CANCELLED:
        return Outcome(Kind.FAIL, "cancelled", mode=FailMode.CANCEL,
                       error={"type": "Cancelled", "message": "cancelled",
                              "reason": "cancelled"})
    if reason == KillReason.TIMEOUT:
        why = f"timeout after {child.kill_detail}"
        return Outcome(Kind.FAIL, "timeout", reason=why, pattern="timeout",
                       error={"type": "Timeout", "message": why, "reason": why})
    if reason == KillReason.MEMORY:
        why = f"memory limit exceeded (peak {_mib(child.peak_rss)}, limit {child.kill_detail})"
        return Outcome(Kind.FAIL, "memory", reason=why, pattern="memory",
                       error={"type": "MemoryLimit", "message": why, "reason": why})
    if reason == KillReason.UNMEASURABLE:
        why = f"memory not measurable: {child.kill_detail}"
        return Outcome(Kind.FAIL, "memory", reason=why,  # the machine's, not the task's
                       error={"type": "MemoryLimit", "message": why, "reason": why})
    if reason == KillReason.PROCESSES:
        why = f"too many processes ({child.kill_detail}, [sandbox].max_processes)"
        return Outcome(Kind.FAIL, "failed", reason=why, pattern="processes",
                       error={"type": "ProcessLimit", "message": why, "reason": why})
    if child.reader.overflow:
        why = f"result too large: over {child.spec.max_result_bytes} bytes (max_result_bytes)"
        return Outcome(Kind.FAIL, "failed", mode=FailMode.FATAL, reason=why,
                       pattern="result_too_large",
                       error={"type": "ResultTooLarge", "message": why, "reason": why})
    if child.reader.violation:  # a hostile or broken child: a crash, retried up to max_crashes
        return Outcome(Kind.EXPIRE, "crashed", pattern="malformed",
                       reason=f"sent a malformed message: {child.reader.violation}")
    report = child.report()
    if report is not None and os.WIFEXITED(status):
        return from_report(child, report)
    if child.oom == "limit":
        # the kernel enforced the job's limit in its cgroup: the job's fault, as above
        why = (f"memory limit exceeded (peak {_mib(child.peak_rss)}, limit "
               f"{child.spec.memory_limit / (1 << 20):.0f} MiB; OOM-killed in its cgroup)")
        return Outcome(Kind.FAIL, "memory", reason=why, pattern="memory",
                       error={"type": "MemoryLimit", "message": why, "reason": why})
    if child.oom == "outside":  # the machine, or an enclosing cgroup, ran out: not the job
        return Outcome(Kind.EXPIRE, "crashed",
                       reason=f"OOM-killed outside its own limit: the machine or an enclosing "
                              f"cgroup ran out of memory ({describe_status(status)}, {peak})")
    if (child.spec.cgroup and os.WIFEXITED(status)
            and os.WEXITSTATUS(status) == JOIN_FAILED):
        return Outcome(Kind.RELEASE, "released", reason="could not join its job cgroup")
    return Outcome(Kind.EXPIRE, "crashed", reason=f"{describe_status(status)} ({peak})",
                   pattern=status_pattern(status))


def from_report(child: RunningChild, report: Report) -> Outcome:
    """What a child's checked result message means (of a chunk's job too: its limits
    are the chunk's, `child`'s)."""
    if report.ok:
        return Outcome(Kind.ACK, "succeeded", result_json=report.result_json,
                       followups=report.followups, batch=report.batch)
    if report.snooze is not None:
        delay, counted = report.snooze
        return Outcome(Kind.FAIL, "snoozed", error=dict(report.error), mode=FailMode.SNOOZE,
                       reason=report.error["reason"], delay_ms=delay, counted=counted)
    if report.throttle is not None:
        delay, group = report.throttle
        return Outcome(Kind.THROTTLE, "throttled", reason=report.error["reason"],
                       delay_ms=min(delay, child.spec.max_throttle_ms), group=group)
    error: dict[str, Any] = dict(report.error)
    if (error.get("type") == "MemoryError" and child.spec.memory_limit
            and child.spec.address_space_factor > 0):
        # the address-space rlimit (the backstop of the memory limit) refused an
        # allocation before the RSS sampling saw it: the same limit, said the same way
        why = (f"memory limit exceeded (peak {_mib(child.peak_rss)}, limit "
               f"{child.spec.memory_limit / (1 << 20):.0f} MiB; address-space backstop)")
        error = {**error, "reason": why}
        return Outcome(Kind.FAIL, "failed", error=error, reason=why, pattern="memory",
                       mode=FailMode.FATAL if report.fatal else FailMode.RETRY)
    return Outcome(Kind.FAIL, "failed", error=error, reason=error["reason"],
                   pattern=exception_pattern(error),
                   mode=FailMode.FATAL if report.fatal else FailMode.RETRY)
