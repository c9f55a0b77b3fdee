"""Human-readable views of jobs, queues, supervisors and schedules for the CLI.

Pure functions: data in, text out (no Redis, no printing), so the CLI decides where
things go and the tests can check the text without a server. Each table is a `Grid`
(header and rows of cells) first: `table` lays it out as plain text (a pipe, a file, a
script), `forq.supervisor.cli.terminal` as a rich table on a terminal. Times in job
records are Redis-clock milliseconds; history entries and heartbeats are seconds.
Everything is shown in the local time zone unless a schedule names its own.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from forq import Job
from forq.fleet import code_status
from forq.supervisor.cli.usage.lines import cost_rows
from forq.units import age, format_size, relative, when, when_ms

REASON_WIDTH = 60  # a dead reason is cut to this in tables; `forq dead show` has it all

Grid = tuple[Sequence[str], list[Sequence[Any]]]  # header, rows


def clip(text: str, width: int) -> str:
    text = " ".join(str(text).split())  # one line: tracebacks and newlines collapse
    return text if len(text) <= width else text[: width - 1] + "…"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces, header first."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)


def printable(text: str) -> str:
    """Text a handler chose, on the operator's terminal: no control characters."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


# -- forq job ---------------------------------------------------------------------


def job(job: Job) -> str:
    """The record and the whole history, oldest first, with time since the first event."""
    f = job.fields
    lines = [f"job {job.id}"]

    def row(label: str, value: Any) -> None:
        lines.append(f"  {label:<10}{value}".rstrip())

    row("task", job.task)
    row("queue", job.queue)
    row("state", job.state + ("  (cancel requested)" if f.get("cancel_requested") else "")
        + (f"  (parked: task {f['parked']} tripped its circuit breaker)"
           if f.get("parked") and job.state == "pending" else ""))
    row("attempts", f"{job.attempts}" + (f" of {f['max_attempts']}" if "max_attempts" in f else "")
        + f"    crashes {job.crashes}" + (f" of {f['max_crashes']}" if "max_crashes" in f else "")
        + (f"    snoozes {job.snoozes}" + (f" of {f['max_snoozes']}" if "max_snoozes" in f
                                          else "") if job.snoozes else ""))
    compact = "args" not in f and job.state == "succeeded"  # retention's default record
    row("args", "not kept (keep_history = true keeps them)" if compact else _compact(job.args))
    if not compact:
        row("kwargs", _compact(job.kwargs))
    for label in ("priority", "key", "group", "parent"):  # each shown when set
        if f.get(label):
            row(label, f[label])
    if job.depends_on:
        waits = f"    waiting on {job.waiting_on}" if job.state == "waiting" else ""
        row("parents", ", ".join(job.depends_on) + waits
            + ("    (allow_failure)" if f.get("allow_failure") else ""))
    if job.batch:
        row("batch", f"{job.batch} (queue {f.get('batch_queue', job.queue)})")
    if f.get("child_batch"):
        row("opened", f"batch {f['child_batch']}")
    row("enqueued", when_ms(f.get("enqueued_at")))
    if f.get("run_at") and f.get("run_at") != f.get("enqueued_at"):
        row("run at", when_ms(f.get("run_at")))
    if f.get("expire_at"):  # expiry before start: never run if not started by then
        row("expires", when_ms(f.get("expire_at")) + ("" if not f.get("started_at")
                                                     else "  (started: no longer applies)"))
    if f.get("started_at"):
        row("started", when_ms(f.get("started_at")))
    if f.get("owner"):
        lease = f"    lease until {when_ms(f['lease_deadline'])}" if f.get("lease_deadline") else ""
        row("owner", f"{f['owner']}{lease}")
    if "code" in f:  # the handler code its last attempt ran (a reload changes it)
        row("code", clip(printable(f["code"]), 80) or "? (no fork server: not known)")
    if f.get("finished_at"):
        row("finished", when_ms(f.get("finished_at")))
    lines.extend(cost_rows(job))  # its last run's, if it has one
    if job.state == "succeeded" or f.get("result") not in (None, ""):
        row("result", _compact(job.result))
    if job.reason:
        row("reason", job.reason)
    error = job.error
    if isinstance(error, dict):
        summary = ": ".join(str(error[k]) for k in ("type", "message") if error.get(k))
        if summary and summary != job.reason:
            row("error", summary)
        tb = str(error.get("traceback") or "").rstrip()
        if tb:
            lines.append("  traceback")
            lines.extend("    " + line for line in tb.splitlines())
    elif error is not None:
        row("error", _compact(error))
    progress = job.progress
    if progress is not None:
        value = progress["value"]
        shown = f"{value * 100:.0f}%" if isinstance(value, float) else "?"
        row("progress", f"{shown}  {clip(printable(progress['message']), 200)}"
            f"    at {when(progress['at'])}")
    steps = job.step_records()
    if steps:
        lines.append(f"  steps ({len(steps)} recorded: a re-run returns these without "
                     f"running them)")
        for name, entry in steps.items():
            lines.append(f"    {when_ms(entry.get('at'))}  {printable(name)}: "
                         f"{clip(_compact(entry.get('result')), 200)}")
    trail = job.memory_trail
    if trail and job.state != "succeeded":  # the death report's: how its memory moved
        lines.append("  memory before its end (seconds before: resident memory)")
        lines.append("    " + "  ".join(f"-{before:g}s: {format_size(size)}"
                                        for before, size in trail))
    if job.output:
        lines.append("  output (stdout and stderr, the last few KiB)")
        lines.extend("    " + printable(line) for line in job.output.splitlines())

    lines.append("  history")
    if not job.history:
        lines.append("    (none)")
    first = next((e["at"] for e in job.history if isinstance(e, dict) and e.get("at")), None)
    for entry in job.history:
        if not isinstance(entry, dict):
            lines.append(f"    {entry}")
            continue
        at = entry.get("at")
        offset = f"+{age(at - first)}" if at and first else ""
        detail = " ".join(f"{k}={_compact(v)}" for k, v in entry.items() if k not in ("event", "at"))
        lines.append(f"    {when(at)}  {offset:>8}  {entry.get('event', '?'):<16} {detail}".rstrip())
    return "\n".join(lines)


# -- forq stats ---------------------------------------------------------------------


NO_QUEUES = "no queues yet"


def stats_grid(stats: Mapping[str, Mapping[str, Any]]) -> Grid:
    header = ("queue", "pending", "scheduled", "active", "dead", "ok/1m", "failed/1m", "oldest",
              "kept-ok", "kept-bytes")
    rows: list[Sequence[Any]] = []
    for name, s in sorted(stats.items()):
        last = s.get("last_minute", {})
        shown = f"{name} (paused)" if s.get("paused") else name  # forq pause
        if s.get("throttled_for"):  # current().throttle, forq throttle
            shown += f" (throttled {age(s['throttled_for'])})"
        if s.get("tripped"):  # the circuit breaker per task: see tripped_lines
            shown += f" (tripped: {', '.join(sorted(s['tripped']))})"
        kept = s.get("retained") or {}  # succeeded and dead records kept, and their bytes
        kept_bytes = sum(int(k.get("bytes", 0)) for k in kept.values())
        rows.append((shown, s["pending"], s["scheduled"], s["active"], s["dead"],
                     last.get("succeeded", 0), last.get("failed", 0),
                     age(s.get("oldest_pending_age")),
                     (kept.get("succeeded") or {}).get("count", 0), format_size(kept_bytes)))
    return header, rows


def stats_table(stats: Mapping[str, Mapping[str, Any]]) -> str:
    if not stats:
        return NO_QUEUES
    return "\n".join([table(*stats_grid(stats)), *tripped_lines(stats)])


def tripped_lines(stats: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A line per task its circuit breaker tripped: the pattern, its parked jobs, and
    when (or how) it resumes."""
    lines = []
    for name, s in sorted(stats.items()):
        for task, why in sorted((s.get("tripped") or {}).items()):
            resumes = (f"resumes in {age(why['resumes_in'])}" if why.get("resumes_in")
                       else f"until `forq resume {name} --task {task}`")
            lines.append(f"tripped: {name} {task}: {why.get('jobs', '?')} jobs ended "
                         f"{why.get('pattern', '?')} ({why.get('ends', '?')} of "
                         f"{why.get('of', '?')} ends); {why.get('parked', 0)} parked, {resumes}")
    return lines


# -- forq dead ---------------------------------------------------------------------


def died_at(job: Job) -> float | None:
    """Time of death in seconds: the finishing time the dead transition recorded."""
    ms = job.fields.get("finished_at")
    try:
        return int(ms) / 1000.0 if ms else None
    except (TypeError, ValueError):
        return None


def dead_grid(jobs: Sequence[Job]) -> Grid:
    rows: list[Sequence[Any]] = [
        (j.id, j.task, clip(j.reason or "-", REASON_WIDTH), when(died_at(j)), j.attempts,
         j.crashes) for j in jobs]
    return ("id", "task", "reason", "died", "attempts", "crashes"), rows


def dead_table(jobs: Sequence[Job]) -> str:
    return table(*dead_grid(jobs))


# -- forq jobs ----------------------------------------------------------------------


def found_grid(jobs: Sequence[Job]) -> Grid:
    """Jobs `forq jobs` found: when each got to its state (died, started, due)."""
    rows: list[Sequence[Any]] = []
    for j in jobs:
        f = j.fields
        at = f.get("finished_at") or f.get("started_at") if j.state in ("dead", "active",
            "succeeded", "cancelled") else f.get("run_at") or f.get("enqueued_at")
        rows.append((j.id, j.task, j.state, when_ms(at), j.attempts, j.crashes,
                     clip(printable(j.reason or "-"), REASON_WIDTH)))
    return ("id", "task", "state", "since", "attempts", "crashes", "reason"), rows


# -- forq supervisors ---------------------------------------------------------------


NO_WORKERS = "no live supervisors"
CODE_WIDTH = 40  # a code cell: a version and a fingerprint fit


def workers_table(records: Sequence[Mapping[str, Any]]) -> str:
    if not records:
        return NO_WORKERS
    return "\n".join([table(*workers_grid(records)), *supervisor_notes(records)])


def workers_grid(records: Sequence[Mapping[str, Any]]) -> Grid:
    rows: list[Sequence[Any]] = []
    for r in records:
        up = None
        if r.get("started") and r.get("heartbeat"):
            up = float(r["heartbeat"]) - float(r["started"])
        rows.append((r.get("name", r.get("id", "?")), r.get("host", "-"), r.get("pid", "-"),
                     r.get("version", "-"), code_cell(r), ",".join(r.get("queues") or []) or "-",
                     f"{r.get('busy', 0)}/{r.get('slots', 0)}", age(r.get("age")), age(up),
                     "yes" if r.get("draining") else "no"))
    return ("name", "host", "pid", "forq", "code", "queues", "busy", "heartbeat", "up",
            "draining"), rows


def code_cell(record: Mapping[str, Any]) -> str:
    """The handler code a supervisor serves ("?" unknown: no fork server, no version),
    with how many jobs still finish in older code and "reload refused" after a reload
    that did not apply (`supervisor_notes` says more)."""
    status = code_status(record)
    cell = clip(printable(status["code"]), CODE_WIDTH) or "?"
    finishing = sum(old["jobs"] for old in status["retiring"])
    if finishing:
        cell += f" (+{finishing} on old)"
    if status["reload_error"] is not None:
        cell += " (reload refused)"
    return cell


def supervisor_notes(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line per old fork server still finishing jobs, and per refused reload."""
    lines = []
    for r in records:
        name = printable(r.get("name", r.get("id", "?")))
        status = code_status(r)
        for old in status["retiring"]:
            lines.append(f"{name}: old fork server {old['pid']} finishing {old['jobs']} "
                         f"job(s) in code {clip(printable(old['code']), CODE_WIDTH) or '?'}")
        refused = status["reload_error"]
        if refused is not None:
            at = when(refused["at"]) if refused["at"] is not None else "?"
            module = refused["module"]
            error = clip(printable(refused["error"]), 300)
            about = f" (module {printable(module)})" if module and module not in error else ""
            lines.append(f"{name}: reload refused at {at}{about}: {error}; still serving "
                         f"code {clip(printable(status['code']), CODE_WIDTH) or '?'}")
    return lines


def memory_notes(budgets: Sequence[Mapping[str, Any]],
                 refused: Sequence[Mapping[str, Any]]) -> list[str]:
    """Admission by memory (`forq.fleet.memory_admission`): a line per supervisor with a
    `memory_budget`, and per job refused as over a whole budget, still waiting."""
    mib = 1 << 20
    lines = []
    for b in budgets:
        line = (f"memory: {printable(b['name'])}: {b['used'] // mib} of {b['budget'] // mib} "
                f"MiB budget in use")
        if b["waiting"]:
            line += f"; {b['waiting']} job(s) waiting for room (longest {age(b['longest_wait'])})"
        lines.append(line)
    for job in refused:
        where = ("over the memory budget of every live supervisor serving its queue: none "
                 "will run it" if job["over_every"] else
                 "over the memory budget of " + ", ".join(printable(n) for n in job["refused_by"]))
        lines.append(f"memory: job {printable(job['id'])} ({printable(job['queue'])}, "
                     f"{printable(job['task'])}) memory_limit {job['limit'] // mib} MiB: {where}")
    return lines


# -- forq schedules -----------------------------------------------------------------


def _in_zone(seconds: float, zone: str) -> str:
    try:
        from zoneinfo import ZoneInfo

        dt = _dt.datetime.fromtimestamp(seconds, ZoneInfo(zone))
    except (ImportError, ValueError, KeyError):
        dt = _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)
    return dt.strftime("%Y-%m-%d %H:%M:%S %Z")


NO_SCHEDULES = "no schedules in the config"
NO_PUBLISHED_SCHEDULES = ("no schedules published by a supervisor (forq schedules --config PATH "
                          "reads a config file)")


def schedules_table(rows: Sequence[Mapping[str, Any]], now: float, *,
                    from_config: bool = True) -> str:
    """Rows as `forq schedules --json` prints them; times in each schedule's zone."""
    if not rows:
        return NO_SCHEDULES if from_config else NO_PUBLISHED_SCHEDULES
    return table(*schedules_grid(rows, now))


def schedules_grid(rows: Sequence[Mapping[str, Any]], now: float) -> Grid:
    out: list[Sequence[Any]] = []
    for s in rows:
        last = s.get("last_fired")
        last_text = "-" if last is None else f"{_in_zone(last, s['timezone'])} ({relative(last, now)})"
        nxt = s.get("next_fire")
        next_text = "-" if nxt is None else f"{_in_zone(nxt, s['timezone'])} ({relative(nxt, now)})"
        if s.get("stale"):
            next_text += " (no supervisor runs it now)"
        source = "run-time" if s.get("source") == "runtime" else "config"
        if s.get("paused"):
            source += ", paused"
        if s.get("shadows"):
            source += " (a run-time one of this name is not run)"
        out.append((s["name"], s["cron"], s["timezone"], s["queue"], s["task"], last_text,
                    next_text, s.get("overlap") or "allow", source))
    return ("name", "cron", "timezone", "queue", "task", "last fired", "next", "overlap",
            "source"), out


# -- forq limit ---------------------------------------------------------------------


def limits(info: Mapping[str, Any]) -> str:
    """One line: the global limits every supervisor applies to this queue."""
    mif = info.get("max_in_flight")
    line = (f"queue {info['queue']}: rate {info.get('rate') or 'none'}, "
            f"max_in_flight {mif if mif is not None else 'none'}")
    if "group_concurrency" in info:
        line += (f"; per group: concurrency {info['group_concurrency']}, "
                 f"rate {info.get('group_rate') or 'none'}")
    return line


def batch(status: Any) -> str:
    """A batch (`forq.batches.BatchStatus`): its counts, callbacks, then each member."""
    lines = [f"batch {status.id}",
             f"  queue     {status.queue}",
             f"  state     {status.state}    {status.ended} of {status.total} ended, "
             f"{status.failed} failed",
             f"  created   {when_ms(status.created_at)}"]
    if status.finished_at:
        lines.append(f"  finished  {when_ms(status.finished_at)}")
    if status.opener:
        parent = f" (member of batch {status.parent_batch})" if status.parent_batch else ""
        lines.append(f"  opened by job {status.opener}{parent}")
    for name, job_id in status.callbacks.items():
        lines.append(f"  {name:<12}{job_id}")
    lines.append("  members")
    for m in status.members:
        detail = _compact(m.result) if m.state == "succeeded" else (m.reason or "")
        where = f" ({m.queue})" if m.queue != status.queue else ""
        lines.append(f"    {m.id}{where}  {m.state or 'gone'}  {detail}".rstrip())
    return "\n".join(lines)
