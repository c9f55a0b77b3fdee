"""forq usage QUEUE [--group G] [--since 1d] [--json]: what the queue's jobs cost.

Every run that ends (succeeded, failed or crashed) adds its CPU time, peak memory and
wall time to its queue's hourly totals, per group (lua/includes/cost.lua), kept about a
week. This reads the hours since `--since` (whole hours: the one `--since` falls in
counts whole), so a multi-tenant deployment that gives each tenant a group can see, or
bill, what each one's jobs cost.
"""

from __future__ import annotations

import argparse
from typing import Any

from forq.store.keys import QueueKeys
from forq.supervisor.cli import render
from forq.supervisor.cli.base import Parents, UsageError, duration_arg, emit, redis_for, redis_now
from forq.units import format_size

HOUR_S = 3600
KEPT_S = 8 * 24 * 3600  # as long as the totals live (USAGE_KEEP_S in lua/includes/cost.lua)
FIGURES = ("jobs", "cpu_ms", "peak", "wall_ms")


def read_usage(client: Any, queue: str, since_s: float, now_s: float) -> dict[str, dict[str, int]]:
    """{group: {jobs, cpu_ms, peak (sum of the runs' peaks), wall_ms}} of the runs of
    `queue` that ended in the hours from `now_s - since_s` to `now_s` (Redis seconds);
    the group "" is the jobs without one. One round trip."""
    keys = QueueKeys(queue)
    last = int(now_s // HOUR_S)
    first = int((now_s - since_s) // HOUR_S)
    pipe = client.pipeline(transaction=False)
    for hour in range(first, last + 1):
        pipe.hgetall(keys.usage(hour))
    totals: dict[str, dict[str, int]] = {}
    for bucket in pipe.execute():
        for name, value in bucket.items():
            figure, _, group = (name.decode() if isinstance(name, bytes) else name).partition(":")
            text = value.decode() if isinstance(value, bytes) else str(value)
            if figure == "runs":  # the four figures packed (lua/includes/cost.lua)
                parts = text.split(",")
                if len(parts) != len(FIGURES) or not all(p.isdigit() for p in parts):
                    continue  # not what the scripts write: not counted
                row = totals.setdefault(group, dict.fromkeys(FIGURES, 0))
                for name_, part in zip(FIGURES, parts, strict=True):
                    row[name_] += int(part)
            elif figure in FIGURES and text.lstrip("-").isdigit():  # a field per figure
                row = totals.setdefault(group, dict.fromkeys(FIGURES, 0))
                row[figure] += int(text)
    return totals


def cmd_usage(args: argparse.Namespace) -> int:
    since = duration_arg(args.since, "--since", positive=True)
    if since > KEPT_S:
        raise UsageError(f"--since {args.since}: usage totals are kept {KEPT_S // 86400} days")
    client = redis_for(args)
    QueueKeys(args.queue)  # a bad name is a usage error, said before any read
    totals = read_usage(client, args.queue, since, redis_now(client))
    if args.group is not None:
        totals = {args.group: totals.get(args.group, dict.fromkeys(FIGURES, 0))}
    if args.json:
        emit({"queue": args.queue, "since": args.since, "groups": [
            {"group": group, "jobs": row["jobs"], "cpu_seconds": row["cpu_ms"] / 1000,
             "peak_memory_sum": row["peak"], "wall_seconds": row["wall_ms"] / 1000}
            for group, row in sorted(totals.items())]})
        return 0
    if not totals:
        print(f"no job of queue {args.queue} ended in the last {args.since}")
        return 0
    rows = [(group or "(no group)", row["jobs"], f"{row['cpu_ms'] / 1000:.3f}s",
             format_size(row["peak"] // row["jobs"]) if row["jobs"] else "-",
             f"{row['wall_ms'] / 1000:.3f}s")
            for group, row in sorted(totals.items(), key=lambda kv: -kv[1]["cpu_ms"])]
    print(f"queue {args.queue}: the runs that ended in the last {args.since} (whole hours)")
    print(render.table(("group", "runs", "cpu", "avg peak memory", "wall"), rows))
    return 0


def register(sub: Any, parents: Parents) -> None:
    p = sub.add_parser("usage", help="what a queue's jobs cost, per group (CPU, memory, wall)",
                       parents=[parents.inspect])
    p.add_argument("queue", help="queue name")
    p.add_argument("--group", "-g", help="only this group (\"\" for the jobs without one)")
    p.add_argument("--since", default="1d",
                   help="how far back, in whole hours: 1h, 1d, 7d (default 1d; kept 8d)")
    p.set_defaults(func=cmd_usage)
