"""Check the recorded history against Redis once the queue has settled.

Inputs: the jobs the producer was told are enqueued, every execution the handlers
appended to the execution log, each job's record and history in Redis, the faults
injected (with times and targets), the Redis outages, and what the monitor saw.

Each execution is tied to the lease it ran under: the last ``claimed`` entry in the
job's history by the same supervisor (owner ``host:pid`` = the child's parent) at or
before the execution started. The lease's end is the next lease-ending entry
(succeeded, retry, dead, reclaimed, released). From that, every execution gets an
*end cause*: completed, failed attempt, handler crash, child killed, memory limit,
drained, supervisor killed / stopped, Redis outage — or a violation (no lease, a
stale ack, a lease lost with no fault to explain it).

Invariants (the issue's numbering):
 1. every told job reached a terminal state (lost = 0);
 2. no job in two states (final sets vs records, the monitor's snapshots, and each
    history replayed through the state machine, with the operator's changes: promoted
    only from scheduled, rescheduled only from pending or scheduled, a priority changed
    only before the job runs, requeued only from dead, and no claim before the run-at
    the job last had); no lease of a dead supervisor;
 3. succeeded jobs ran to completion (the stored result names a completed execution
    of the lease that was current at the ack; a success with no recorded execution is a
    violation); every re-execution has a cause (a chunk's jobs: chaos/chunks.py);
 4. idempotent jobs have exactly one completed execution (an extra one is excused
    only when the first completion's report could not land: its supervisor was
    killed or stopped, or Redis was down — reported, never silent);
 5. dead jobs are dead for a stated reason consistent with their record, history
    and what the job was built to do;
 6. reclaim latency: supervisor kill/stop ≤ lease_ttl + reaper_interval + tolerance,
    child crash ≤ 1 s;
 7. supervisors: none exited on its own, drains exited 0 in time, no tracebacks;
 8. no two executions of a job overlap in time (beyond `OVERLAP_MARGIN` of clock
    granularity): an execution that recorded its end after a later one of the same
    job had started ran while the job was already someone else's — a frozen or
    partitioned supervisor whose child outlived its lease. An execution killed before
    its end recorded nothing, so only overlaps that it proves are counted (the
    executions that ran to their end, which is what a child left running does).
 12. a handler's own transitions held: after a snooze the job was not claimed before
    its run_at, after a throttle no job of its queue (of its group) was claimed before
    the throttle's end, each counted in the job's snoozes; a dependent and a batch's
    callback read exactly the results its parents' records hold.
 10. every batch's on_complete was enqueued exactly once, by the transition that ended
    its last member (its ``enqueued_at`` is that member's ``finished_at`` and the
    batch's, no earlier than any member's end, one ``enqueued`` entry in its history,
    the batch's count at exactly 0), and ran to completion at least once, never before
    the last member ended; on_success the same when every member succeeded, and never
    enqueued or run otherwise. A callback may run more than once (at-least-once: a
    crash, or a lost ack), each extra run with a cause checked by invariant 3.
 13. the queues' events agree with every job's record and history, each death enqueued
    one on_dead job naming it, and a debounced job ran the last call's arguments
    (chaos/stories.py).
"""

from __future__ import annotations

import bisect
import json
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forq import Job, Queue, QueueEvent

from . import stories
from .chunks import CRASHED_WITH_CHUNK, ChunkLog
from .context import OTHER_QUEUE, QUEUE, Context

LEASE_END = ("succeeded", "retry", "dead", "reclaimed", "released", "cancelled", "snoozed",
             "throttled")
TERMINAL = ("succeeded", "dead", "cancelled")
FAULT_CAUSES = ("supervisor killed", "supervisor stopped", "supervisor drained",
                "supervisor partitioned",
                "supervisor exited", "redis outage", "supervisor starved of CPU",
                "redis stalled (host)")
STARVED = 0.5  # s of run-queue wait within a lease that can explain losing it
STARVED_LATE = 0.3  # s of run-queue wait that can explain a late reclaim
OWN_CAUSES = ("completed", "failed attempt", "fatal error", "handler crash", "child killed",
              "memory limit", "drained (released)", "completion recorded earlier", "snoozed",
              "throttled", CRASHED_WITH_CHUNK)
MAX_EXAMPLES = 25
OVERLAP_MARGIN = 0.05  # s: the children's wall clocks are one clock, read a moment apart
CALLBACKS = ("on_complete", "on_success")


@dataclass
class Exec:
    job: str
    x: str
    spid: int
    pid: int
    sup: str
    start: float
    kind: str
    n: int
    end: float | None = None
    outcome: str | None = None  # ok | raise | fatal | crash | snooze | throttle | None (killed)
    claim: Claim | None = None
    cause: str = ""
    chunk: str = ""  # the chunk it ran in (`chaos.chunked`), if any: chaos/chunks.py


@dataclass
class Claim:
    at: float
    owner: str
    token: str
    index: int
    end_event: str | None = None
    end_at: float | None = None
    end_reason: str = ""
    end_source: str | None = None
    crashed: str | None = None  # the parent's crash report (expire), if any
    by: str = ""  # who reclaimed it
    execs: list[Exec] = field(default_factory=list)

    @property
    def owner_pid(self) -> int:
        try:
            return int(self.owner.rsplit(":", 1)[1])
        except (IndexError, ValueError):
            return -1


@dataclass
class Invariant:
    number: int
    name: str
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    count: int = 0  # total violations (examples are capped)
    _kinds: dict[str, int] = field(default_factory=dict)

    def fail(self, message: str) -> None:
        """Count a violation; keep a few examples of each kind, so one flood of the same
        problem cannot hide a different one."""
        self.count += 1
        kind = re.sub(r"[0-9a-f]{8,}|\d+(\.\d+)?", "#", message.split(": ", 1)[-1])[:50]
        seen = self._kinds.get(kind, 0)
        self._kinds[kind] = seen + 1
        if seen < 3 and len(self.violations) < MAX_EXAMPLES:
            self.violations.append(message)

    @property
    def ok(self) -> bool:
        return self.count == 0

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "name": self.name, "ok": self.ok,
                "violations": self.count, "examples": self.violations, "notes": self.notes}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[k]


def dist(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": pct(values, 0.5), "p99": pct(values, 0.99),
            "max": max(values) if values else None,
            "mean": statistics.fmean(values) if values else None}


def load_execs(path: Path) -> tuple[dict[str, Exec], list[str]]:
    execs: dict[str, Exec] = {}
    problems = []
    if not path.exists():
        return execs, problems
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
        except ValueError:
            problems.append(f"execution log line {lineno} is not JSON: {line[:80]!r}")
            continue
        if rec.get("ev") == "start":
            execs[rec["x"]] = Exec(rec["job"], rec["x"], int(rec["spid"]), int(rec["pid"]),
                                   rec.get("sup", ""), float(rec["t"]), rec.get("kind", ""),
                                   int(rec.get("n", 0)), chunk=rec.get("chunk", ""))
        elif rec.get("ev") == "end":
            e = execs.get(rec["x"])
            if e is None:
                problems.append(f"execution log: end of unknown execution {rec['x']}")
                continue
            e.end = float(rec["t"])
            e.outcome = rec.get("outcome")
    return execs, problems


def load_jobs(queue: Queue, ids: list[str],
              kept: Mapping[str, tuple[str, dict[str, str], list[str]]] | None = None,
              ) -> dict[str, Job | None]:
    """Each job's record and history; one retention trimmed is read from its copy in
    `kept` (the monitor's, chaos/monitor.py), marked ``trimmed``."""
    out: dict[str, Job | None] = {}
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        pipe = queue.redis.pipeline(transaction=False)
        for jid in chunk:
            pipe.hgetall(queue.keys.job(jid))
            pipe.lrange(queue.keys.history(jid), 0, -1)
        replies = pipe.execute()
        for i, jid in enumerate(chunk):
            record, history = replies[2 * i], replies[2 * i + 1]
            if not record and kept and jid in kept:
                record, history = dict(kept[jid][1], trimmed="1"), kept[jid][2]
            out[jid] = Job.from_record(queue, record, history) if record else None
    return out


def load_batches(queue: Queue, ids: list[str]) -> dict[str, dict[str, str]]:
    """Each batch's record, with how many members its ``:ended`` and ``:failed`` sets
    hold (as ``_ended``, ``_failed``); {} for a batch with no record."""
    out: dict[str, dict[str, str]] = {}
    for start in range(0, len(ids), 500):
        chunk = ids[start:start + 500]
        pipe = queue.redis.pipeline(transaction=False)
        for bid in chunk:
            key = queue.keys.batch(bid)
            pipe.hgetall(key)
            pipe.scard(key + ":ended")
            pipe.scard(key + ":failed")
        replies = pipe.execute()
        for i, bid in enumerate(chunk):
            record, ended, failed = replies[3 * i:3 * i + 3]
            out[bid] = {**record, "_ended": str(ended), "_failed": str(failed)} if record else {}
    return out


def read_events(queue: Queue) -> dict[str, list[QueueEvent]]:
    """Every event the queue kept (chaos keeps them all: `events_keep`), by job."""
    out: dict[str, list[QueueEvent]] = defaultdict(list)
    for event in queue.events():
        out[event.job_id].append(event)
    return out


def final_sets(queue: Queue) -> dict[str, list[str]]:
    pipe = queue.redis.pipeline(transaction=True)
    for name in ("pending", "scheduled", "active", "dead"):
        pipe.zrange(getattr(queue.keys, name), 0, -1)
    replies = pipe.execute()
    return dict(zip(("pending", "scheduled", "active", "dead"), replies, strict=True))


class Checker:
    def __init__(self, ctx: Context, queue: Queue) -> None:
        self.ctx = ctx
        self.s = ctx.settings
        self.queue = queue
        self.inv = {n: Invariant(n, name) for n, name in (
            (1, "nothing told is lost"),
            (2, "one state per job; no lease of a dead supervisor"),
            (3, "successes ran to completion; every re-execution has a cause"),
            (4, "idempotent jobs complete exactly once"),
            (5, "dead jobs are dead for a consistent, stated reason"),
            (6, "reclaim latency within bounds"),
            (7, "supervisors survive, drain cleanly, log no tracebacks"),
            (8, "no two executions of a job overlap in time"),
            (9, "durable steps: a success saw the recorded results, never re-ran one"),
            (10, "every batch's callbacks enqueued exactly once, after all its members ended"),
            (11, "no two jobs of a group run at once (group_concurrency 1)"),
            (12, "handlers' snoozes and throttles held; parents' results read as stored"),
            (13, "events tell each job's story; each death reported; debounce runs the last call"),
        )}
        self.stats: dict[str, Any] = {}
        self.late_excused: list[str] = []
        self.late_redis: list[str] = []  # late reclaims while Redis could not take reports
        self.cause_examples: dict[str, list[dict[str, Any]]] = {}
        # fault indexes
        self.child_kills: dict[int, dict[str, Any]] = {}
        self.child_kills_by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.execs_by_job: dict[str, list[Exec]] = {}  # each sorted by start (run())
        self.chunks = ChunkLog({})  # the chunks the handlers recorded (run())
        self.sup_faults: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for f in ctx.faults:
            if f.get("skipped"):
                continue
            if f["kind"] == "child_kill":
                self.child_kills[f["pid"]] = f
                self.child_kills_by_job[f["job"]].append(f)
            elif f["kind"] in ("sup_kill", "sup_stop", "sup_term", "partition"):
                self.sup_faults[f["pid"]].append(f)
        for u in ctx.unexpected_exits:
            try:
                pid = int(u["sup_id"].rsplit(":", 1)[1])
            except (IndexError, ValueError):
                continue
            self.sup_faults[pid].append({"kind": "exited", "t": u["t"], "t_end": u["t"]})

    # -- attribution ---------------------------------------------------------------------

    def fault_cause(self, owner_pid: int, t0: float, t1: float) -> str | None:
        """A fault that explains a lease lost between t0 and t1, if any."""
        for f in self.sup_faults.get(owner_pid, []):
            start, end = f["t"], f.get("t_end", f["t"])
            if f["kind"] == "sup_kill" and t0 - 0.5 <= start <= t1:
                return "supervisor killed"
            if f["kind"] == "sup_stop" and start <= t1 and t0 <= end:
                return "supervisor stopped"
            if f["kind"] == "sup_term" and start <= t1 and t0 <= end:
                return "supervisor drained"
            if f["kind"] == "partition" and start <= t1 and t0 - 0.5 <= end:
                return "supervisor partitioned"
            if f["kind"] == "exited" and t0 - 0.5 <= start <= t1 + 0.5:
                return "supervisor exited"
        for start, end in self.ctx.redis_outages:
            if start <= t1 and t0 - 0.5 <= end:
                return "redis outage"
        if self.starved(owner_pid, t0, t1) >= STARVED:
            return "supervisor starved of CPU"
        for start, end in self.ctx.redis_slow:
            if end - start >= 0.5 and start <= t1 and t0 - 0.5 <= end:
                return "redis stalled (host)"
        return None

    def starved(self, pid: int, t0: float, t1: float) -> float:
        """Seconds `pid` waited for a CPU between t0 and t1 (sampled: rounded outwards)."""
        series = next((run for run in self.ctx.sched.get(pid, [])
                       if run and run[0][0] <= t1 and run[-1][0] >= t0), None)
        if not series:
            return 0.0
        times = [t for t, _ in series]
        i = max(0, bisect.bisect_right(times, t0) - 1)
        j = min(len(series) - 1, bisect.bisect_left(times, t1))
        return max(0.0, series[j][1] - series[i][1])

    def killed_by_chaos(self, e: Exec) -> bool:
        """This execution's process is the one the injector SIGKILLed (pids recycle)."""
        if e.chunk:
            return self.chunks.killed(e)
        f = self.child_kills.get(e.pid)
        if f is not None and e.outcome is None and e.start <= f["t"] and f["job"] == e.job:
            return True
        if e.pid != 1 or e.outcome is not None:
            return False
        # PID 1 of namespaces of its own (--namespaces): its record cannot say its pid
        # outside; the injector killed the execution of its job that started last before
        for f in self.child_kills_by_job.get(e.job, ()):
            started = [x for x in self.execs_by_job.get(e.job, ()) if x.start <= f["t"]]
            if started and started[-1] is e:
                return True
        return False

    @staticmethod
    def pid_of(sup_id: str) -> int:
        try:
            return int(sup_id.rsplit(":", 1)[1])
        except (IndexError, ValueError):
            return -1

    def end_cause(self, e: Exec, job: Job) -> str:
        """Why this execution did not (or did) finish its job."""
        if e.outcome == "raise":
            return "failed attempt"
        if e.outcome == "fatal":
            return "fatal error"
        if e.outcome == "crash":
            return "handler crash"
        if e.outcome == "snooze":
            return "snoozed"
        if e.outcome == "throttle":
            return "throttled"
        c = e.claim
        if c is None:
            return "VIOLATION: ran without a lease"
        result_x = (job.result or {}).get("x") if isinstance(job.result, dict) else None
        if self.killed_by_chaos(e):
            return "child killed"
        if c.end_event is None:
            return "VIOLATION: lease never ended"
        if c.end_event == "released":
            if any(f["kind"] == "sup_term" and f["t"] <= (c.end_at or 0) + 0.1
                   and c.at <= f.get("t_end", f["t"]) for f in self.sup_faults.get(c.owner_pid, [])):
                return "drained (released)"
            if e.chunk and "of its chunk" in c.end_reason:
                # the chunk stopped for another job's lost lease: a fault's doing, or none
                return self.fault_cause(c.owner_pid, c.at, c.end_at or c.at) or \
                    f"VIOLATION: released with its chunk ({c.end_reason}), no fault to explain it"
            return "VIOLATION: its lease was released, but its supervisor was not draining"
        if c.crashed is not None and self.chunks.crashed_with(e):
            return CRASHED_WITH_CHUNK
        by_fail = c.end_event == "retry" or (c.end_event == "dead" and c.crashed is None
                                             and "crashes exhausted" not in c.end_reason)
        if by_fail:
            reason = c.end_reason.lower()
            if "memory" in reason:
                return "memory limit"
            if "timeout" in reason:
                return "timeout"
            return f"VIOLATION: its lease ended in a failure it did not raise ({c.end_reason})"
        if c.end_event == "succeeded":
            if result_x == e.x:
                return "completed"
            if c.end_source:
                return "completion recorded earlier"
            return "VIOLATION: its lease was acked with another execution's result"
        if c.crashed is not None:
            if "memory" in c.crashed.lower():
                return "memory limit"
            cause = self.fault_cause(c.owner_pid, c.at, c.end_at or c.at)
            if cause:
                return cause
            return f"VIOLATION: unexplained crash ({c.crashed})"
        if "memory" in c.end_reason.lower():
            return "memory limit"
        cause = self.fault_cause(c.owner_pid, c.at, c.end_at or c.at)
        if cause:
            return cause
        return f"VIOLATION: lease lost with no fault to explain it ({c.end_event}: {c.end_reason})"

    # -- the run ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        ctx = self.ctx
        execs, log_problems = load_execs(ctx.exec_log)
        for p in log_problems:
            self.inv[3].fail(p)
        queues = {QUEUE: self.queue, OTHER_QUEUE: Queue(OTHER_QUEUE, redis=self.queue.redis)}
        sets = final_sets(self.queue)
        queue_of = {jid: told.queue for jid, told in ctx.told.items()}
        for name, members in final_sets(queues[OTHER_QUEUE]).items():
            sets[name] = sets[name] + members
            queue_of.update((jid, OTHER_QUEUE) for jid in members)
        ids = set(ctx.told) | {e.job for e in execs.values()}
        for members in sets.values():
            ids.update(members)
        for jid in ids:  # an on_dead job is enqueued on its dead job's queue
            dead, _, n = jid.rpartition("-on-dead-")
            if dead and n.isdigit() and jid not in queue_of and dead in queue_of:
                queue_of[jid] = queue_of[dead]
        by_queue: dict[str, list[str]] = defaultdict(list)
        for jid in sorted(ids):
            by_queue[queue_of.get(jid, QUEUE)].append(jid)
        jobs = {jid: job for name, chunk in by_queue.items()
                for jid, job in load_jobs(queues[name], chunk, ctx.kept).items()}
        by_job: dict[str, list[Exec]] = defaultdict(list)
        for e in execs.values():
            by_job[e.job].append(e)
        for lst in by_job.values():
            lst.sort(key=lambda e: e.start)
        self.execs_by_job = by_job
        self.chunks = ChunkLog.load(ctx.exec_log, execs, [
            f for f in ctx.faults if f["kind"] == "child_kill" and f.get("chunk")
            and not f.get("skipped")])

        claims_by_job: dict[str, list[Claim]] = {}
        for jid, job in jobs.items():
            if job is not None:
                claims_by_job[jid] = self.claims(job)
        for jid, lst in by_job.items():
            self.attach(jid, lst, claims_by_job.get(jid, []))

        self.check_lost(jobs)
        self.check_states(jobs, sets)
        causes = self.check_executions(jobs, by_job)
        self.check_idempotent(jobs, by_job)
        dead_reasons = self.check_dead(jobs, claims_by_job)
        latency = self.check_latency(jobs, claims_by_job, by_job)
        self.check_supervisors()
        self.check_overlap(by_job)
        self.check_steps(jobs, by_job)
        self.check_batches(jobs, by_job)
        self.check_groups(jobs, by_job)
        self.check_control(jobs)
        self.check_stories(jobs, queues)

        told_jobs = [jobs.get(j) for j in ctx.told]
        states = Counter(j.state if j is not None else
                         "not enqueued" if ctx.told[jid].optional else "missing"
                         for jid, j in zip(ctx.told, told_jobs, strict=True))
        finished = [int(j.fields.get("finished_at", 0)) / 1000 for j in told_jobs
                    if j is not None and j.state in TERMINAL and j.fields.get("finished_at")]
        first = min((t.told_at for t in ctx.told.values()), default=ctx.started)
        span = (max(finished) - first) if finished else 0.0
        n_exec = len(execs)
        with_exec = len(by_job)
        self.stats.update({
            "told": len(ctx.told),
            "not_told": len(ctx.not_told),
            "enqueue_errors": ctx.enqueue_errors,
            "told_after_retry": sum(1 for t in ctx.told.values() if t.tries > 1),
            "landed_before_told": sum(1 for t in ctx.told.values() if t.status == "duplicate"),
            "extra_in_redis": len([j for j in jobs if j not in ctx.told]),
            "states": dict(states),
            "kinds": dict(Counter(t.kind for t in ctx.told.values())),
            "operator": dict(ctx.operator),  # jobs changed while they waited
            "executions": n_exec,
            "jobs_executed": with_exec,
            "re_executions": n_exec - with_exec,
            "end_causes": dict(causes["all"]),
            "re_execution_causes": dict(causes["again"]),
            "re_execution_examples": self.cause_examples,
            "dead_reasons": dict(dead_reasons),
            "chunks": self.chunks.stats(),
            "latency": latency,
            "throughput": (states.get("succeeded", 0) + states.get("dead", 0)) / span if span else 0.0,
            "span_s": span,
            "faults": dict(Counter(f["kind"] for f in ctx.faults if not f.get("skipped"))),
            "faults_skipped": dict(Counter(f["kind"] for f in ctx.faults if f.get("skipped"))),
            "redis_outage_s": round(sum(b - a for a, b in ctx.redis_outages), 2),
            "redis_stalls_uninjected": [
                [round(a - ctx.started, 2), round(b - a, 2)] for a, b in ctx.redis_slow
                if not any(o0 - 0.5 <= b and a <= o1 + 1.0 for o0, o1 in ctx.redis_outages)],
            "lost": self.inv[1].count,
            "host": self.host_load(),
        })
        return {"invariants": [i.to_dict() for i in self.inv.values()], "stats": self.stats,
                "ok": all(i.ok for i in self.inv.values())}

    def host_load(self) -> dict[str, Any]:
        """How loaded the machine was: CPU pressure (PSI), and the largest share of time
        a supervisor spent waiting for a CPU."""
        psi = [v for _, v in self.ctx.cpu_pressure]
        share = 0.0
        for series in (run for runs in self.ctx.sched.values() for run in runs):
            if len(series) >= 2 and series[-1][0] > series[0][0]:
                share = max(share, (series[-1][1] - series[0][1]) / (series[-1][0] - series[0][0]))
        return {"cpu_pressure_avg": statistics.fmean(psi) if psi else None,
                "cpu_pressure_max": max(psi) if psi else None,
                "supervisor_cpu_wait_share_max": round(share, 3)}

    # -- leases ----------------------------------------------------------------------------

    @staticmethod
    def claims(job: Job) -> list[Claim]:
        out: list[Claim] = []
        open_claim: Claim | None = None
        for i, h in enumerate(job.history):
            if not isinstance(h, dict):
                continue
            ev = h.get("event")
            if ev == "claimed":
                open_claim = Claim(float(h["at"]), str(h.get("owner", "")), str(h.get("token", "")), i)
                out.append(open_claim)
            elif open_claim is not None and ev == "crashed":
                open_claim.crashed = str(h.get("reason", ""))
            elif open_claim is not None and ev in LEASE_END:
                open_claim.end_event = ev
                open_claim.end_at = float(h["at"])
                open_claim.end_reason = str(h.get("reason", ""))
                open_claim.end_source = h.get("source")
                open_claim.by = str(h.get("by", ""))
                open_claim = None
        return out

    def attach(self, jid: str, execs: list[Exec], claims: list[Claim]) -> None:
        for e in execs:
            best = None
            for c in claims:
                if c.owner_pid == e.spid and c.at <= e.start:
                    if best is None or c.at > best.at:
                        best = c
            e.claim = best
            if best is not None:
                best.execs.append(e)

    # -- 1 -----------------------------------------------------------------------------------

    def check_lost(self, jobs: dict[str, Job | None]) -> None:
        inv = self.inv[1]
        for jid, told in sorted(self.ctx.told.items()):
            job = jobs.get(jid)
            if job is None and told.optional:
                continue  # a failed batch's on_success: invariant 10 says whether it is due
            if job is None:
                inv.fail(f"{jid}: told enqueued at {told.told_at:.3f}, no record in Redis")
            elif job.state not in TERMINAL:
                inv.fail(f"{jid}: still {job.state} after the settle wait")

    # -- 2 -----------------------------------------------------------------------------------

    def check_states(self, jobs: dict[str, Job | None], sets: dict[str, list[str]]) -> None:
        inv = self.inv[2]
        where: dict[str, list[str]] = defaultdict(list)
        for name, members in sets.items():
            for jid in members:
                where[jid].append(name)
        for jid, names in where.items():
            if len(names) > 1:
                inv.fail(f"{jid}: in {' and '.join(names)} at the end")
            job = jobs.get(jid)
            if job is None:
                inv.fail(f"{jid}: in {names[0]} without a record")
            elif job.state != names[0]:
                inv.fail(f"{jid}: in {names[0]} but its record says {job.state}")
        for jid, job in jobs.items():
            if job is None:
                continue
            trimmed = job.fields.get("trimmed")  # by retention, after the copy was taken
            if job.state in ("pending", "scheduled", "active", "dead") and not trimmed \
                    and job.state not in where.get(jid, []):
                inv.fail(f"{jid}: state {job.state} but not in the {job.state} set")
            for problem in self.replay(job):
                inv.fail(f"{jid}: {problem}")
        for v in self.ctx.monitor_violations:
            inv.fail(f"during the run ({v['t'] - self.ctx.started:.1f}s): {v['kind']}: {v['detail']}")
        inv.notes.append(f"{len(self.ctx.samples)} consistent snapshots taken during the run")

    @staticmethod
    def replay(job: Job) -> list[str]:
        """Replay the history through the state machine; return what is illegal."""
        problems = []
        history = [h for h in job.history if isinstance(h, dict)]
        truncated = len(history) >= 100 and history and history[0].get("event") != "enqueued"
        state = None if not truncated else "?"
        last_token = -1
        terminal = None
        due = None  # the run-at (ms) the job waits for: no claim may come before it
        for h in history:
            ev = h.get("event")
            if terminal is not None and ev not in ("enqueued", "requeued"):
                problems.append(f"'{ev}' after '{terminal}' (a job finished twice / ran after finishing)")
            if ev == "enqueued":
                if state is not None:
                    problems.append(f"enqueued again while {state}")
                state = ("waiting" if h.get("depends_on") else
                         "scheduled" if h.get("run_at") else "pending")
                due = h.get("run_at")
            elif ev == "released" and state == "waiting":  # its last parent ended
                state = str(h.get("state") or "pending")
            elif ev == "replaced":  # a debounced or replacing enqueue: its time may move
                if state not in ("pending", "scheduled", "?"):
                    problems.append(f"replaced while {state}")
                if h.get("run_at") is not None:
                    due = h["run_at"]
                    if state != "?":
                        state = "scheduled" if int(due) > h["at"] * 1000 else "pending"
            elif ev == "claimed":
                if state not in ("pending", "scheduled", "?"):
                    problems.append(f"claimed while {state}")
                at = h.get("at")
                if isinstance(due, (int, float)) and isinstance(at, (int, float)) \
                        and at * 1000 + 1 < due:
                    problems.append(f"claimed {due - at * 1000:.0f} ms before its run-at")
                due = None
                try:
                    token = int(h.get("token"))
                    if token <= last_token:
                        problems.append(f"token {token} not after {last_token}")
                    last_token = token
                except (TypeError, ValueError):
                    problems.append(f"claim without a token: {h}")
                state = "active"
            elif ev == "crashed":
                if state not in ("active", "?"):
                    problems.append(f"crash reported while {state}")
            elif ev in ("reclaimed", "released"):
                if state not in ("active", "?"):
                    problems.append(f"{ev} while {state}")
                state = "pending"
            elif ev in ("retry", "snoozed"):
                if state not in ("active", "?"):
                    problems.append(f"{ev} while {state}")
                state = "scheduled"
                due = h.get("run_at")
            elif ev == "throttled":
                if state not in ("active", "?"):
                    problems.append(f"throttled while {state}")
                state, due = "pending", None
            elif ev == "promoted":  # an operator ran a scheduled job now
                if state not in ("scheduled", "?"):
                    problems.append(f"promoted while {state}")
                state, due = "pending", None
            elif ev == "rescheduled":  # a new run-at: scheduled until then, or pending now
                if state not in ("scheduled", "pending", "?"):
                    problems.append(f"rescheduled while {state}")
                due = h.get("run_at")
                state = "scheduled" if due else "pending"
            elif ev == "priority":  # changes no state, and only before the job runs
                if state not in ("pending", "scheduled", "waiting", "?"):
                    problems.append(f"priority changed while {state}")
            elif ev == "requeued":  # an operator gave a dead job a fresh start
                if state not in ("dead", "?"):
                    problems.append(f"requeued while {state}")
                state, terminal, due = "pending", None, None
            elif ev == "succeeded":
                allowed = ("active", "pending", "?") if h.get("source") else ("active", "?")
                if state not in allowed:
                    problems.append(f"succeeded while {state}")
                state = terminal = "succeeded"
            elif ev == "dead":
                if state not in ("active", "?") and not (
                        state == "waiting" and str(h.get("reason", "")).startswith("dependency ")):
                    problems.append(f"dead while {state}")
                state = terminal = "dead"
            elif ev == "cancelled":
                state = terminal = "cancelled"
        if state not in (None, "?") and state != job.state:
            problems.append(f"history ends {state}, record says {job.state}")
        return problems

    # -- 3 -----------------------------------------------------------------------------------

    def check_executions(self, jobs: dict[str, Job | None], by_job: dict[str, list[Exec]]) -> dict[str, Counter]:
        inv = self.inv[3]
        all_causes: Counter = Counter()
        again: Counter = Counter()
        for jid, lst in by_job.items():
            job = jobs.get(jid)
            if job is None:
                inv.fail(f"{jid}: executed but has no record")
                continue
            for e in lst:
                e.cause = self.end_cause(e, job)
            per_claim = Counter(id(e.claim) for e in lst if e.claim is not None)
            for e in lst:
                if e.claim is not None and per_claim[id(e.claim)] > 1:
                    inv.fail(f"{jid}: {per_claim[id(e.claim)]} executions under one lease "
                             f"(token {e.claim.token})")
                    per_claim[id(e.claim)] = 0
            result = job.result if isinstance(job.result, dict) else {}
            final = result.get("x") if job.state == "succeeded" else lst[-1].x
            for e in lst:
                cause = e.cause
                label = cause if not cause.startswith("VIOLATION") else "unexplained"
                all_causes[label] += 1
                if e.x != final:
                    again[label] += 1
                    shown = self.cause_examples.setdefault(label, [])
                    if len(shown) < 5:
                        c = e.claim
                        shown.append({
                            "job": jid, "execution": e.x, "sup": e.sup, "pid": e.pid,
                            "start": round(e.start - self.ctx.started, 3),
                            "end": round(e.end - self.ctx.started, 3) if e.end else None,
                            "outcome": e.outcome,
                            "lease_end": c and c.end_event, "lease_end_reason": c and c.end_reason,
                            "lease_end_at": c and c.end_at and round(c.end_at - self.ctx.started, 3),
                        })
                if cause.startswith("VIOLATION"):
                    inv.fail(f"{jid}: execution {e.x} (pid {e.pid} under {e.sup}): {cause[11:]}")
            if job.state == "succeeded":
                self.check_success(jid, job, lst)
        unrecorded = sorted(jid for jid, job in jobs.items() if job is not None
                            and job.state == "succeeded" and jid not in by_job)
        for jid in unrecorded:  # every chaos handler records its runs: a success came from one
            result = getattr(jobs[jid], "result", None)
            inv.fail(f"{jid}: succeeded, but no execution of it was recorded (its result "
                     f"names {result.get('x') if isinstance(result, dict) else None})")
        if unrecorded:
            inv.notes.append(f"{len(unrecorded)} successes with no recorded execution: "
                             + ", ".join(unrecorded[:5]))
        inv.notes.append("re-executions by cause: " + ", ".join(
            f"{k} {v}" for k, v in again.most_common()))
        return {"all": all_causes, "again": again}

    def check_success(self, jid: str, job: Job, lst: list[Exec]) -> None:
        inv = self.inv[3]
        result = job.result if isinstance(job.result, dict) else {}
        x = result.get("x")
        e = next((e for e in lst if e.x == x), None)
        if e is None:
            inv.fail(f"{jid}: succeeded, but its result names no recorded execution ({x})")
            return
        if e.outcome != "ok":
            inv.fail(f"{jid}: succeeded with the result of execution {x}, which did not complete")
            return
        hist = [h for h in job.history if isinstance(h, dict)]
        done = next((h for h in hist if h.get("event") == "succeeded"), None)
        if done is None:
            return
        if e.end is not None and e.end > float(done["at"]) + 0.05:
            inv.fail(f"{jid}: acked at {done['at']:.3f} before its execution completed "
                     f"({e.end:.3f})")
        if done.get("source"):
            return
        claims_before = [h for h in hist[:hist.index(done)] if h.get("event") == "claimed"]
        if not claims_before or e.claim is None or \
                str(claims_before[-1].get("token")) != e.claim.token:
            current = claims_before[-1] if claims_before else {}
            inv.fail(f"{jid}: stale ack — the result of execution {x} (lease token "
                     f"{e.claim.token if e.claim else '?'}) was accepted while token "
                     f"{current.get('token')} of {current.get('owner')} held the lease "
                     f"(fencing failed)")

    # -- 4 -----------------------------------------------------------------------------------

    def check_idempotent(self, jobs: dict[str, Job | None], by_job: dict[str, list[Exec]]) -> None:
        inv = self.inv[4]
        excused: Counter = Counter()
        n = 0
        for jid, told in self.ctx.told.items():
            if not told.idempotent:
                continue
            n += 1
            job = jobs.get(jid)
            done = [e for e in by_job.get(jid, []) if e.outcome == "ok"]
            if job is not None and job.state == "succeeded" and not done:
                inv.fail(f"{jid}: succeeded without a completed execution")
            if len(done) <= 1:
                continue
            # The job ran again after completing: legitimate only if each earlier
            # completion's report could not land (its lease was lost to a fault).
            done.sort(key=lambda e: e.start)
            for e in done[:-1]:
                if e.cause in FAULT_CAUSES:
                    excused[e.cause] += 1
                else:
                    inv.fail(f"{jid}: completed {len(done)} times; execution {e.x} under "
                             f"{e.sup} completed ({e.cause}) and yet the job ran again")
        inv.notes.append(f"{n} idempotent jobs")
        if excused:
            inv.notes.append("extra completions whose first report could not land (excused, "
                             "at-least-once across a frozen/killed parent): " + ", ".join(
                                 f"{k} {v}" for k, v in excused.most_common()))
        self.stats["idempotent_excused"] = dict(excused)

    # -- 5 -----------------------------------------------------------------------------------

    def check_dead(self, jobs: dict[str, Job | None], claims_by_job: dict[str, list[Claim]]) -> Counter:
        inv = self.inv[5]
        reasons: Counter = Counter()
        for jid, told in sorted(self.ctx.told.items()):
            job = jobs.get(jid)
            if job is None:
                continue
            if job.state == "succeeded" and told.expect != "succeed":
                what = {"dead:memory": "memory limit not enforced",
                        "dead:attempts": "failed attempts not counted",
                        "dead:crashes": "crashes not counted",
                        "dead:fatal": "a non-retryable error was retried to success",
                        "dead:snoozes": "snoozes past max_snoozes not counted"}[told.expect]
                inv.fail(f"{jid} ({told.kind}): succeeded, expected {told.expect}: {what}")
            if job.state != "dead":
                continue
            reason = job.fields.get("dead_reason", "") or ""
            hist = [h for h in job.history if isinstance(h, dict)]
            complete = bool(hist) and hist[0].get("event") == "enqueued"
            attempts, crashes = job.attempts, job.crashes
            max_attempts = int(job.fields.get("max_attempts", told.max_attempts))
            max_crashes = int(job.fields.get("max_crashes", told.max_crashes))
            if "attempts exhausted:" in reason:
                n = int(reason.rsplit("attempts exhausted:", 1)[1].strip(" )"))
                label = "memory limit (attempts exhausted)" if "memory" in reason.lower() \
                    else "attempts exhausted"
                reasons[label] += 1
                if n != attempts or n < max_attempts:
                    inv.fail(f"{jid}: '{reason}' but attempts={attempts}, max_attempts={max_attempts}")
                retries = sum(1 for h in hist if h.get("event") == "retry")
                if complete and retries != n - 1:
                    inv.fail(f"{jid}: '{reason}' but the history shows {retries} retries")
                if told.expect not in ("dead:attempts", "dead:memory"):
                    inv.fail(f"{jid} ({told.kind}): dead by '{reason}', expected {told.expect}")
                if told.expect == "dead:memory" and "memory" not in reason.lower():
                    inv.fail(f"{jid}: memhog dead for '{reason}', not its memory limit")
            elif "crashes exhausted:" in reason:
                n = int(reason.rsplit("crashes exhausted:", 1)[1].strip(" )"))
                if n != crashes or n < max_crashes:
                    inv.fail(f"{jid}: '{reason}' but crashes={crashes}, max_crashes={max_crashes}")
                reclaims = sum(1 for h in hist if h.get("event") == "reclaimed")
                if complete and reclaims != n - 1:
                    inv.fail(f"{jid}: '{reason}' but the history shows {reclaims} reclaims")
                if told.expect == "dead:crashes":
                    reasons["crashes exhausted"] += 1
                else:
                    # crashes from the faults: at least one must be a fault's doing
                    lost = [c for c in claims_by_job.get(jid, [])
                            if c.end_event in ("reclaimed", "dead") and c.end_source is None]
                    chaos = [c for c in lost if any(
                        self.killed_by_chaos(e) or e.cause in FAULT_CAUSES for e in c.execs)
                        or (not c.execs and self.fault_cause(c.owner_pid, c.at, c.end_at or c.at))]
                    # a chunk's other job crashed it (or a fault) before it reached this one
                    siblings = [c for c in lost if c.crashed is not None and (
                        any(e.cause == CRASHED_WITH_CHUNK for e in c.execs) or not c.execs
                        and self.chunks.bystander(jid, c.owner_pid, c.at, c.end_at or c.at,
                                                  FAULT_CAUSES))]
                    if chaos:
                        reasons["crashes exhausted (chaos faults)"] += 1
                    elif siblings and told.kind == "chunked":
                        reasons["crashes exhausted (chunk siblings)"] += 1
                    else:
                        inv.fail(f"{jid} ({told.kind}): dead by '{reason}' with no fault or "
                                 f"handler crash to explain it")
            elif "over max_snoozes" in reason:
                reasons["snoozes exhausted"] += 1
                snoozes = int(job.fields.get("snoozes") or 0)
                limit = int(job.fields.get("max_snoozes", 100))
                if snoozes != limit + 1:
                    inv.fail(f"{jid}: '{reason}' but snoozes={snoozes}, max_snoozes={limit}")
                if told.expect != "dead:snoozes":
                    inv.fail(f"{jid} ({told.kind}): dead by '{reason}', expected {told.expect}")
            elif reason.startswith("dependency "):
                reasons["a parent did not succeed"] += 1
                parent = jobs.get(reason.split()[1])
                if parent is None or parent.state not in ("dead", "cancelled"):
                    inv.fail(f"{jid}: '{reason}', but that parent is "
                             f"{parent.state if parent else 'gone'}")
            elif "NonRetryable" in reason:
                reasons["non-retryable error"] += 1
                if told.expect != "dead:fatal":
                    inv.fail(f"{jid} ({told.kind}): dead by '{reason}', expected {told.expect}")
                if attempts != 1:
                    inv.fail(f"{jid}: non-retryable error after {attempts} attempts")
            elif "memory" in reason.lower():
                reasons["memory limit"] += 1
                if told.expect != "dead:memory":
                    inv.fail(f"{jid} ({told.kind}): dead by '{reason}', expected {told.expect}")
            else:
                reasons["other"] += 1
                inv.fail(f"{jid}: dead for an unexplained reason: {reason!r}")
        for jid, told in self.ctx.told.items():
            job = jobs.get(jid)
            if told.expect == "dead:memory" and job is not None and job.state == "dead":
                if "memory" not in (job.fields.get("dead_reason") or "").lower():
                    inv.fail(f"{jid}: memory hog dead for '{job.fields.get('dead_reason')}'")
        return reasons

    # -- 6 -----------------------------------------------------------------------------------

    def check_latency(self, jobs: dict[str, Job | None], claims_by_job: dict[str, list[Claim]],
                      by_job: dict[str, list[Exec]]) -> dict[str, Any]:
        inv = self.inv[6]
        s = self.s
        sup_lat: dict[str, list[float]] = {"sup_kill": [], "sup_stop": []}
        per_fault = []
        by_owner: dict[str, list[Claim]] = defaultdict(list)
        for lst in claims_by_job.values():
            for c in lst:
                by_owner[c.owner].append(c)
        for f in self.ctx.faults:
            if f["kind"] not in ("sup_kill", "sup_stop") or f.get("skipped"):
                continue
            t = f["t"]
            held = [c for c in by_owner.get(f["sup_id"], [])
                    if c.at <= t and (c.end_at is None or c.end_at > t)]
            worst = 0.0
            for c in held:
                if f["kind"] == "sup_stop" and c.end_event not in ("reclaimed", "dead"):
                    continue  # renewed after SIGCONT before any reaper saw it expire
                if f["kind"] == "sup_stop" and c.end_source is not None:
                    continue
                if c.end_at is None:
                    inv.fail(f"{f['kind']} of {f['sup']} at {t - self.ctx.started:.1f}s: "
                             f"its lease of token {c.token} was never reclaimed")
                    continue
                lat = c.end_at - t
                sup_lat[f["kind"]].append(lat)
                worst = max(worst, lat)
                if lat > s.reclaim_bound and not self.excuse_late(c, t, lat, s.reclaim_bound):
                    inv.fail(f"{f['kind']} of {f['sup']} at {t - self.ctx.started:.1f}s: a lease "
                             f"(token {c.token}) reclaimed after {lat:.2f}s > bound "
                             f"{s.reclaim_bound:.2f}s")
            per_fault.append({"kind": f["kind"], "sup": f["sup"], "leases": len(held),
                              "worst_s": round(worst, 3)})
        child: list[float] = []
        chaos_child: list[float] = []
        for f in self.ctx.faults:
            if f["kind"] != "child_kill" or f.get("skipped"):
                continue
            hit = self.chunks.hit_by(f) if f.get("chunk") else None
            for jid in hit.jobs if hit is not None else [f["job"]]:
                claims = claims_by_job.get(jid, [])
                c = next((c for c in claims if c.at <= f["t"] and (c.end_at is None or c.end_at >= f["t"] - 0.01)
                          and c.owner == f["sup_id"]), None)
                if c is None and f.get("chunk"):
                    continue  # a job of the chunk reported and acked before the kill
                if c is None or c.end_at is None:
                    inv.fail(f"child kill of {jid} at {f['t'] - self.ctx.started:.1f}s: "
                             f"its lease was not found or never ended")
                    continue
                if c.crashed is None:
                    continue  # it finished just before the kill: nothing to reclaim
                lat = c.end_at - f["t"]
                chaos_child.append(lat)
                child.append(lat)
                if lat > s.child_bound and not self.excuse_late(c, f["t"], lat, s.child_bound):
                    inv.fail(f"child kill of {jid}: back in pending after {lat:.2f}s > "
                             f"{s.child_bound:.1f}s")
        own: list[float] = []
        for lst in by_job.values():
            for e in lst:
                if e.outcome != "crash" or e.claim is None or e.claim.end_at is None:
                    continue
                if e.claim.crashed is None:
                    continue  # lease lost meanwhile (a fault), counted there
                lat = e.claim.end_at - e.end
                if self.fault_cause(e.claim.owner_pid, e.end - 1, e.claim.end_at):
                    continue  # a fault overlapped this crash: not a fair measure
                own.append(lat)
                child.append(lat)
                if lat > s.child_bound and not self.excuse_late(e.claim, e.end, lat, s.child_bound):
                    inv.fail(f"{e.job}: handler crash at {e.end - self.ctx.started:.1f}s back in "
                             f"pending after {lat:.2f}s > {s.child_bound:.1f}s")
        if self.late_excused:
            inv.notes.append(f"{len(self.late_excused)} late reclaim(s) not counted: the "
                             f"reclaiming supervisor waited ≥ {STARVED_LATE}s for a CPU meanwhile "
                             f"(a loaded host, not forq): " + "; ".join(self.late_excused[:5]))
        if self.late_redis:
            inv.notes.append(f"{len(self.late_redis)} late reclaim(s) not counted: Redis was "
                             f"down or full meanwhile, and the reclaim came within the bound "
                             f"of its return: " + "; ".join(self.late_redis[:5]))
        inv.notes.append(f"bounds: supervisor death {s.reclaim_bound:.2f}s "
                         f"(lease_ttl {s.lease_ttl}s + reaper {s.reaper_interval}s + "
                         f"tolerance {s.tolerance}s); child crash {s.child_bound:.1f}s")
        return {"sup_kill": dist(sup_lat["sup_kill"]), "sup_stop": dist(sup_lat["sup_stop"]),
                "child_crash": dist(child), "child_kill": dist(chaos_child),
                "handler_crash": dist(own), "per_fault": per_fault,
                "late_excused_starved": len(self.late_excused)}

    def excuse_late(self, c: Claim, t: float, lat: float, bound: float) -> bool:
        """A late reclaim is not held against forq if the supervisor that had to act
        (the reclaimer, else the lease's owner) was starved of CPU meanwhile, or if Redis
        could not take the crash's report (down, or full: a report it refuses waits,
        with its lease kept) and the reclaim came within `bound` of Redis taking it."""
        until = self.redis_unavailable_until(t, t + lat)
        if until is not None and t + lat - until <= bound:
            self.late_redis.append(f"{lat:.2f}s, Redis back {t + lat - until:.2f}s before")
            return True
        pid = self.pid_of(c.by) if c.by else c.owner_pid
        waited = self.starved(pid, t, t + lat)
        if waited >= STARVED_LATE:
            self.late_excused.append(f"{lat:.2f}s, {waited:.2f}s run-queue wait")
            return True
        return False

    def redis_unavailable_until(self, t0: float, t1: float) -> float | None:
        """The end of the last Redis outage or full spell (`redis_full`) overlapping
        [t0, t1], if any."""
        spells = [(a, b) for a, b in self.ctx.redis_outages]
        spells += [(f["t"], f.get("t_end", f["t"])) for f in self.ctx.faults
                   if f["kind"] == "redis_full"]
        ends = [b for a, b in spells if a <= t1 and b >= t0]
        return max(ends) if ends else None

    # -- 7 -----------------------------------------------------------------------------------

    def check_steps(self, jobs: dict[str, Job | None], by_job: dict[str, list[Exec]]) -> None:
        """A durable step's function runs again only while its result was not recorded:
        the execution that succeeded returned exactly the recorded results, each made by
        one of the job's executions (its id prefixes the value), and one that came after
        a recorded step was never made by a later execution."""
        inv = self.inv[9]
        n = reused = 0
        for jid, told in self.ctx.told.items():
            job = jobs.get(jid)
            if told.kind != "steps" or job is None or job.state != "succeeded":
                continue
            n += 1
            result = job.result if isinstance(job.result, dict) else {}
            recorded = job.steps
            seen = result.get("steps")
            if seen != [recorded.get(name) for name in ("a", "b", "c")]:
                inv.fail(f"{jid}: its success returned steps {seen}, Redis recorded {recorded}")
                continue
            xs = [e.x for e in by_job.get(jid, [])]  # executions, oldest first
            makers = [str(v).rsplit("/", 1)[0] for v in seen]
            if any(m not in xs for m in makers):
                inv.fail(f"{jid}: recorded steps {seen} made by no execution of it ({xs})")
                continue
            order = [xs.index(m) for m in makers]
            if order != sorted(order):  # a later step recorded by an earlier execution
                inv.fail(f"{jid}: steps {seen} recorded out of execution order ({xs})")
            reused += makers[0] != result.get("x")
        inv.notes.append(f"{n} jobs with durable steps succeeded; {reused} of them reused "
                         f"a step recorded by an earlier execution")

    def check_supervisors(self) -> None:
        inv = self.inv[7]
        s = self.s
        for u in self.ctx.unexpected_exits:
            inv.fail(f"supervisor {u['sup']} ({u['sup_id']}) exited on its own with {u['rc']}")
        for f in self.ctx.faults:
            if f["kind"] != "sup_term" or f.get("skipped"):
                continue
            if f["rc"] != 0:
                inv.fail(f"drain of {f['sup']} exited with {f['rc']}, expected 0")
            limit = s.drain_timeout + 2.0 + 1.5
            if f["drain_s"] > limit:
                inv.fail(f"drain of {f['sup']} took {f['drain_s']}s > {limit:.1f}s")
        for sp in self.ctx.supervisors:
            try:
                text = sp.log_path.read_text(errors="replace")
            except OSError:
                continue
            n = text.count("Traceback (most recent call last)")
            if n:
                first = text.index("Traceback (most recent call last)")
                inv.fail(f"{sp.name}: {n} traceback(s) in {sp.log_path}; first: "
                         + " | ".join(text[first:first + 1500].splitlines()[-3:]))
        if self.ctx.errors:
            inv.notes.extend(f"harness: {e}" for e in self.ctx.errors)


    def check_overlap(self, by_job: dict[str, list[Exec]]) -> None:
        inv = self.inv[8]
        for jid, lst in by_job.items():  # each sorted by start
            for i, later in enumerate(lst):
                for earlier in lst[:i]:
                    if earlier.end is not None and earlier.end > later.start + OVERLAP_MARGIN:
                        inv.fail(f"{jid}: execution {earlier.x} (pid {earlier.pid} under "
                                 f"{earlier.sup}) ran {earlier.end - later.start:.3f}s into "
                                 f"execution {later.x} (pid {later.pid} under {later.sup})")
        inv.notes.append(f"executions compared by their recorded start and end, margin "
                         f"{OVERLAP_MARGIN * 1000:.0f} ms")

    # -- 12 ----------------------------------------------------------------------------------

    def check_stories(self, jobs: dict[str, Job | None], queues: dict[str, Queue]) -> None:
        """The events, the on_dead jobs and the debounced calls (chaos/stories.py); the
        on_dead jobs of dead jobs no set or execution brought in are read first."""
        events: dict[str, list[QueueEvent]] = {}
        kept_from: dict[str, float] = {}
        for name, queue in queues.items():
            found = read_events(queue)
            events.update(found)
            kept_from[name] = min((e[0].at for e in found.values() if e), default=0.0)
        wanted: dict[str, list[str]] = defaultdict(list)
        for jid, job in jobs.items():
            if job is not None and job.state == "dead" and f"{jid}-on-dead-1" not in jobs:
                wanted[job.queue].append(f"{jid}-on-dead-1")
        for name, ids in wanted.items():
            jobs.update((jid, job) for jid, job in load_jobs(queues[name], ids).items()
                        if job is not None)
        stories.check(self.inv[13], jobs, events, self.ctx.debounce_calls, kept_from)

    def check_control(self, jobs: dict[str, Job | None]) -> None:
        inv = self.inv[12]
        present = {jid: job for jid, job in jobs.items() if job is not None}
        # each batch's members, gathered once: a pass over every job told for each
        # callback kept a 100-minute soak's check busy for more than ten minutes
        members: dict[Any, list[str]] = defaultdict(list)
        for jid, told in self.ctx.told.items():
            if told.kind != "batch-cb":
                members[told.batch].append(jid)
        callbacks = {jid: members.get(told.batch, []) for jid, told in self.ctx.told.items()
                     if told.kind == "batch-cb" and present.get(jid) is not None}
        for problem in self.control_problems(present, callbacks):
            inv.fail(problem)
        counted = Counter(h.get("event") for job in present.values() for h in job.history
                          if isinstance(h, dict) and h.get("event") in ("snoozed", "throttled"))
        read = sum(1 for job in present.values() if job.state == "succeeded"
                   and isinstance(job.result, dict) and "parents" in job.result)
        inv.notes.append(f"{counted['snoozed']} snoozes, {counted['throttled']} throttles; "
                         f"{read} dependents and callbacks read their parents' results")

    @staticmethod
    def control_problems(jobs: dict[str, Job], callbacks: dict[str, list[str]]) -> list[str]:
        """What broke a handler's own transitions, from the jobs' records and histories:
        a claim before a snooze's run_at; a claim of a job of a throttled queue (group)
        before the throttle's end; snoozes not counted; a dependent or a batch's callback
        (`callbacks`: its batch's members) that read other results than its parents'
        records hold. Pure: the self-test feeds it histories."""
        problems = []
        claims: list[tuple[float, str, str, str]] = []  # (ms, queue, group, job)
        holds: list[tuple[float, float, str, str, str]] = []  # (from, until, queue, group, by)
        for jid, job in sorted(jobs.items()):
            history = [h for h in job.history if isinstance(h, dict)]
            group = str(job.fields.get("group") or "")
            due = None  # a snooze's run_at, ms: the next claim comes no earlier
            for h in history:
                at = float(h.get("at", 0)) * 1000
                ev = h.get("event")
                if ev == "claimed":
                    claims.append((at, job.queue, group, jid))
                    if due is not None and at < due - 1:
                        problems.append(f"{jid}: claimed at {at:.0f}, before its snooze's "
                                        f"run_at {due:.0f}")
                    due = None
                elif ev == "snoozed":
                    due = float(h.get("run_at") or 0)
                elif ev == "throttled" and float(h.get("until") or 0) > at:
                    scope_group = str(h.get("group") or "") if h.get("scope") == "group" else ""
                    holds.append((at, float(h["until"]), job.queue, scope_group, jid))
            if history and history[0].get("event") == "enqueued":
                snoozes = sum(1 for h in history if h.get("event") in ("snoozed", "throttled"))
                snoozes += sum(1 for h in history if h.get("event") == "dead"
                               and "over max_snoozes" in str(h.get("reason")))
                if snoozes != int(job.fields.get("snoozes") or 0):
                    problems.append(f"{jid}: {snoozes} snoozes and throttles in its history, "
                                    f"its record counts {job.fields.get('snoozes') or 0}")
        claims.sort()
        starts = [c[0] for c in claims]
        for since, until, queue, group, by in holds:
            for at, q, g, jid in claims[bisect.bisect_right(starts, since):
                                        bisect.bisect_left(starts, until - 1)]:
                if q == queue and (not group or g == group):
                    scope = f"group {group}" if group else f"queue {queue}"
                    problems.append(f"{jid}: claimed at {at:.0f}, while {by} had throttled "
                                    f"its {scope} until {until:.0f}")
                    break
        for jid, job in sorted(jobs.items()):
            result = job.result if isinstance(job.result, dict) else {}
            if job.state != "succeeded" or "parents" not in result:
                continue
            parents = callbacks.get(jid, job.depends_on)
            stored = {p: jobs[p].result for p in parents
                      if p in jobs and jobs[p].state == "succeeded"}
            if result["parents"] != stored:
                wrong = sorted(set(result["parents"]) ^ set(stored)) or sorted(
                    p for p in stored if result["parents"].get(p) != stored[p])
                problems.append(f"{jid}: read its parents' results {wrong[:3]} other than "
                                "their records hold")
        return problems

    # -- 11 ----------------------------------------------------------------------------------

    def check_groups(self, jobs: dict[str, Job | None], by_job: dict[str, list[Exec]]) -> None:
        inv = self.inv[11]
        group_of = {jid: str(job.fields["group"]) for jid, job in jobs.items()
                    if job is not None and job.fields.get("group")}
        for problem in self.group_problems(group_of, by_job):
            inv.fail(problem)
        inv.notes.append(f"{len(group_of)} grouped jobs in {len(set(group_of.values()))} "
                         f"groups; executions of different jobs of a group compared by "
                         f"their recorded start and end, margin {OVERLAP_MARGIN * 1000:.0f} ms")

    @staticmethod
    def group_problems(group_of: dict[str, str], by_job: dict[str, list[Exec]]) -> list[str]:
        """Executions of two jobs of one group that overlap in time. As for invariant
        8, only an execution that recorded its end can prove an overlap."""
        runs: dict[str, list[Exec]] = defaultdict(list)
        for jid, group in group_of.items():
            runs[group].extend(by_job.get(jid, []))
        problems = []
        for group, lst in sorted(runs.items()):
            lst.sort(key=lambda e: e.start)
            for i, later in enumerate(lst):
                for earlier in lst[:i]:
                    if (earlier.job != later.job and earlier.end is not None
                            and earlier.end > later.start + OVERLAP_MARGIN):
                        problems.append(
                            f"group {group}: {earlier.job} (pid {earlier.pid} under "
                            f"{earlier.sup}) ran {earlier.end - later.start:.3f}s into "
                            f"{later.job} (pid {later.pid} under {later.sup})")
        return problems

    # -- 9 -----------------------------------------------------------------------------------

    def check_batches(self, jobs: dict[str, Job | None], by_job: dict[str, list[Exec]]) -> None:
        inv = self.inv[10]
        members: dict[str, list[str]] = defaultdict(list)
        for jid, told in self.ctx.told.items():
            if told.batch and told.kind != "batch-cb":
                members[told.batch].append(jid)
        # a batch a member's handler opened (current().batch) is "<member id>-b"
        openers = {bid: bid[:-2] for bid in members if bid.endswith("-b")
                   and bid[:-2] in self.ctx.told}
        records = load_batches(self.queue, sorted(members))
        outcome: Counter = Counter()
        runs: Counter = Counter()
        reruns: Counter = Counter()
        delays: list[float] = []  # s from a relayed last member's end to the callback
        for bid, ids in sorted(members.items()):
            record = records.get(bid, {})
            callbacks = {role: jobs.get(f"{bid}-{role}") for role in CALLBACKS}
            execs = {role: by_job.get(f"{bid}-{role}", []) for role in CALLBACKS}
            opener = openers.get(bid)
            if opener is not None:
                opener_job = jobs.get(opener)
                if not record and (opener_job is None or opener_job.state != "succeeded"):
                    # opened with the opener's ack (its report), which never landed
                    outcome["never opened (its opener died)"] += 1
                    there = [j for j in [*ids, *(f"{bid}-{r}" for r in CALLBACKS)] if jobs.get(j)]
                    if there:
                        inv.fail(f"{bid}: never opened, yet {there[0]} exists")
                    continue
                ids = [opener, *ids]  # the opener counts in the batch it opened
            outcome[record.get("status", "no record")] += 1
            children = {m: records[f"{m}-b"] for m in ids
                        if m != opener and records.get(f"{m}-b")}
            relayed = frozenset(m for m in ids if self.ctx.told[m].queue != QUEUE)
            for problem in self.batch_problems(record, {m: jobs.get(m) for m in ids},
                                               callbacks, execs, children, relayed):
                inv.fail(f"{bid}: {problem}")
            relay_delay = self.relay_delay({m: jobs.get(m) for m in ids}, children, relayed,
                                           callbacks["on_complete"])
            if relay_delay is not None:
                delays.append(relay_delay)
            for role, lst in execs.items():
                if lst:
                    runs[role] += len(lst)
                    # the run whose ack won names itself in the result (as for invariant 3)
                    cb = callbacks[role]
                    final = (cb.result or {}).get("x") if cb is not None and isinstance(
                        cb.result, dict) else None
                    reruns.update(e.cause or "?" for e in lst if e.x != final)
        self.stats["batches"] = {"batches": len(members), "nested": len(openers),
                                 "by_status": dict(outcome),
                                 "callback_runs": dict(runs), "callback_reruns": dict(reruns),
                                 "relayed": sum(1 for ids in members.values() if any(
                                     self.ctx.told[m].queue != QUEUE for m in ids)),
                                 "relay_delay": dist(delays)}
        inv.notes.append(f"{len(members)} batches, {len(openers)} of them opened by a member "
                         f"({', '.join(f'{k} {v}' for k, v in outcome.most_common())}); "
                         f"callback runs {dict(runs)}; runs beyond the first completed one, "
                         f"by cause (at-least-once, each checked by invariant 3): {dict(reruns)}")

    @staticmethod
    def member_ends(members: dict[str, Job | None], children: dict[str, dict[str, str]] | None
                    ) -> dict[str, tuple[int, bool, str]] | str:
        """Member -> (when it ended in its batch, whether as succeeded, how), or what
        keeps the batch from being done. A member that opened a batch ends when that
        batch is done, as succeeded only if the batch did."""
        ends: dict[str, tuple[int, bool, str]] = {}
        for m, j in members.items():
            child = (children or {}).get(m)
            if j is None:
                return f"member {m} has no record, in an opened batch"
            if j.state not in TERMINAL or (child and not child.get("finished_at")):
                return f"member {m} never ended (invariant 1), so no callback is due"
            if child:
                ends[m] = (int(child["finished_at"]), child.get("status") == "succeeded",
                           f"{j.state}, the batch it opened {child.get('status')}")
            else:
                ends[m] = (int(j.fields.get("finished_at") or 0), j.state == "succeeded", j.state)
        return ends

    @classmethod
    def relay_delay(cls, members: dict[str, Job | None], children: dict[str, dict[str, str]] | None,
                    relayed: frozenset[str], callback: Job | None) -> float | None:
        """Seconds from the end of a batch's last member to its on_complete's enqueue, when
        that member is on another queue (its end was carried by the relay)."""
        ends = cls.member_ends(members, children)
        if not relayed or callback is None or isinstance(ends, str) or not ends:
            return None
        last = max(ends, key=lambda m: ends[m][0])
        if last not in relayed:
            return None
        return (int(callback.fields.get("enqueued_at") or 0) - ends[last][0]) / 1000

    @staticmethod
    def batch_problems(record: dict[str, str], members: dict[str, Job | None],
                       callbacks: dict[str, Job | None], execs: dict[str, list[Exec]],
                       children: dict[str, dict[str, str]] | None = None,
                       relayed: frozenset[str] = frozenset()) -> list[str]:
        """What is wrong with one batch, from its record (with ``_ended``/``_failed``,
        see `load_batches`), its members' and callbacks' records (None: no record), its
        callbacks' recorded executions, and the records of batches its members opened
        (`children`: such a member ends here when its batch is done, as succeeded only
        if that batch did). For a batch opened by a member, `members` holds that opener
        too. `relayed`: the members on another queue, whose ends reach the batch through
        their queue's relay (a reaper pass): a callback enqueued with the delivery of
        one comes after its end. Pure: the self-test feeds it histories."""
        if not record:
            return ["no batch record in Redis"]
        ends = Checker.member_ends(members, children)
        if isinstance(ends, str):
            return [ends]
        problems = []
        ended = {m: at for m, (at, _, _) in ends.items()}
        last, last_at = max(ended.items(), key=lambda kv: (kv[1], kv[0]))
        failed = sorted(m for m, (_, ok, _) in ends.items() if not ok)
        counted = len(members) - (1 if record.get("opener") else 0)
        if record.get("opener") and record["opener"] not in members:
            problems.append(f"opened by {record['opener']}, not by the member expected")
        total = int(record.get("total", -1))
        if total != counted:
            problems.append(f"its record counts {total} members, the producer gave {counted}")
        remaining = int(record.get("remaining", 0))
        if remaining != 0:
            problems.append(f"remaining {remaining} with every member ended: a member counted "
                            + ("twice" if remaining < 0 else "never"))
        if int(record.get("_ended", -1)) != len(members):
            problems.append(f"{record.get('_ended')} members in its ended set, {len(members)} ended")
        if int(record.get("_failed", -1)) != len(failed):
            problems.append(f"{record.get('_failed')} members in its failed set, "
                            f"{len(failed)} did not succeed")
        status = "failed" if failed else "succeeded"
        if record.get("status") != status:
            problems.append(f"status {record.get('status')!r}, expected {status!r}")
        done_at = int(record.get("finished_at") or 0)
        for role in CALLBACKS:
            job, runs = callbacks.get(role), execs.get(role, [])
            if role not in record:  # the batch was opened without this callback
                if job is not None or runs:
                    problems.append(f"{role} exists, though the batch has none")
                continue
            if role == "on_success" and failed:
                why = f"member {failed[0]} ended {ends[failed[0]][2]}"
                if job is not None:
                    problems.append(f"on_success enqueued although {why}")
                if runs:
                    problems.append(f"on_success ran {len(runs)} time(s) although {why}")
                continue
            if job is None:
                problems.append(f"{role} never enqueued, though every member ended "
                                f"({last} last, at {last_at})")
                continue
            history = [h for h in job.history if isinstance(h, dict)]
            enqueues = sum(1 for h in history if h.get("event") == "enqueued")
            if enqueues != 1:
                problems.append(f"{role} enqueued {enqueues} times (its history)")
            at = int(job.fields.get("enqueued_at") or 0)
            early = sorted((t, m) for m, t in ended.items() if t > at)
            if early:
                problems.append(f"{role} enqueued at {at}, before member {early[-1][1]} "
                                f"ended at {early[-1][0]}")
            elif at != last_at and not (at > last_at and relayed):
                problems.append(f"{role} enqueued at {at}, not with the end of the last "
                                f"member ({last} at {last_at})")
            if at != done_at:
                problems.append(f"{role} enqueued at {at}, the batch done at {done_at}: "
                                "the batch was done again, or its callback enqueued apart")
            if job.state != "succeeded" or not any(e.outcome == "ok" for e in runs):
                problems.append(f"{role} never ran to completion (it is {job.state}, "
                                f"{len(runs)} run(s) recorded)")
            first = min(runs, key=lambda e: e.start) if runs else None
            if first is not None and first.start < last_at / 1000 - OVERLAP_MARGIN:
                problems.append(f"{role} ran at {first.start:.3f}, before member {last} "
                                f"ended at {last_at / 1000:.3f}")
        return problems


def check(ctx: Context, queue: Queue | None = None) -> dict[str, Any]:
    from .producer import client

    queue = queue or Queue(QUEUE, redis=client(ctx.redis.url, timeout=10))
    return Checker(ctx, queue).run()
