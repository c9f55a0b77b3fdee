"""Human-readable views of jobs and queues for the CLI and the demo."""

from __future__ import annotations

import time
from typing import Any

from jobs import Job


def _when(seconds: float | None) -> str:
    if not seconds:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}"


def job(job: Job) -> str:
    lines = [
        f"job {job.id}",
        f"  task      {job.task}",
        f"  queue     {job.queue}",
        f"  state     {job.state}",
        f"  attempts  {job.attempts}    crashes {job.crashes}",
        f"  args      {job.fields.get('args', '[]')}  kwargs {job.fields.get('kwargs', '{}')}",
    ]
    if job.state == "succeeded":
        lines.append(f"  result    {job.fields.get('result')}")
    if job.reason:
        lines.append(f"  reason    {job.reason}")
    lines.append("  history")
    for entry in job.history:
        extra = {k: v for k, v in entry.items() if k not in ("event", "at")}
        detail = " ".join(f"{k}={v}" for k, v in extra.items())
        lines.append(f"    {_when(entry.get('at'))}  {entry.get('event', '?'):<16} {detail}")
    return "\n".join(lines)


def stats_table(stats: dict[str, dict[str, Any]]) -> str:
    header = ("queue", "pending", "scheduled", "active", "dead", "ok/1m", "failed/1m", "oldest")
    rows = [header]
    for name, s in sorted(stats.items()):
        last = s.get("last_minute", {})
        age = s.get("oldest_pending_age")
        rows.append((name, str(s["pending"]), str(s["scheduled"]), str(s["active"]),
                     str(s["dead"]), str(last.get("succeeded", 0)), str(last.get("failed", 0)),
                     "-" if age is None else f"{age:.1f}s"))
    if len(rows) == 1:
        return "no queues yet"
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)
