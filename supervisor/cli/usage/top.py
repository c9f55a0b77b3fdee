"""forq top [-q QUEUE] [--once] [--interval 2s] [--json]: the running jobs, live.

What every live supervisor says of its children in its heartbeat (`forq.fleet`,
refreshed every 2 s: CPU so far and CPU % since its last beat, RSS now and its peak,
the memory limit), with each job's lease deadline (Redis's, authoritative) and its
handler's last progress, read as the dashboard's "running now" reads them
(`forq.web.data.running`: one round trip for the records, one for the jobs). On a
terminal the view is redrawn in place until Ctrl-C; elsewhere, or with ``--once``, plain
frames (``--once``: one, then exit).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

import redis

from forq.supervisor.cli import render, terminal
from forq.supervisor.cli.base import Parents, duration_arg, emit, queue_named, redis_for
from forq.units import age, format_size

HEADER = ("job", "queue", "task", "host", "elapsed", "cpu%", "cpu", "rss / limit", "peak",
          "lease left", "progress")


def running_jobs(client: redis.Redis, queue: str | None) -> dict[str, Any]:
    """{"now_ms", "jobs": [...]}: the active jobs (of `queue`, or all), busiest first."""
    from forq.web.data import running

    seen = running(client)
    jobs = [job for job in seen["jobs"] if queue is None or job["queue"] == queue]
    jobs.sort(key=lambda j: -(j["child"].get("cpu_percent") or 0))
    return {"now_ms": seen["now_ms"], "jobs": jobs}


def _progress(job: dict[str, Any]) -> str:
    value, message = job.get("progress"), job.get("progress_message") or ""
    shown = (f"{100 * value:.0f}%" if isinstance(value, (int, float)) and 0 <= value <= 1
             else "" if value is None else str(value)[:20])
    return render.clip(render.printable(f"{shown} {message}".strip()), 40)


def grid(seen: dict[str, Any]) -> render.Grid:
    rows: list[Sequence[Any]] = []
    for job in seen["jobs"]:
        child = job["child"]
        started = child.get("started_ms")
        limit, now = child.get("memory_limit"), child.get("rss_now")
        memory = (format_size(now) if isinstance(now, int) else "-") + (
            f" / {format_size(limit)}" if limit else "")
        percent = child.get("cpu_percent")
        rows.append((
            job["id"], job["queue"], job.get("task") or "?",
            child.get("host") or ("(held)" if job.get("held") else "?"),
            age((seen["now_ms"] - started) / 1000 if started else None),
            "-" if percent is None else f"{percent:.0f}",
            "-" if child.get("cpu") is None else f"{child['cpu']:.1f}s",
            memory,
            format_size(child["rss"]) if isinstance(child.get("rss"), int) else "-",
            age((job["lease_deadline_ms"] - seen["now_ms"]) / 1000),
            _progress(job)))
    return HEADER, rows


def plain(seen: dict[str, Any]) -> str:
    if not seen["jobs"]:
        return "no job running"
    return render.table(*grid(seen))


def cmd_top(args: argparse.Namespace) -> int:
    client = redis_for(args)
    if args.queue:
        queue_named(args.queue, client)  # a bad name is a usage error before anything is read
    interval = duration_arg(args.interval, "--interval", positive=True)
    seen = running_jobs(client, args.queue)  # an unreachable Redis fails here: exit 1
    if args.once:
        if args.json:
            emit(seen["jobs"])
        else:
            print(plain(seen))
        return 0
    return terminal.watch(
        lambda: running_jobs(client, args.queue), seen, interval, as_json=args.json,
        title=lambda seen: f"forq top   {time.strftime('%Y-%m-%d %H:%M:%S')}   "
                           f"{len(seen['jobs'])} running   every {age(interval)}   "
                           f"(Ctrl-C to stop)",
        frame=lambda seen: {"time": time.time(), "jobs": seen["jobs"]},
        grid=lambda seen: grid(seen) if seen["jobs"] else None,
        plain=plain, stale="the last read is shown")


def register(sub: Any, parents: Parents) -> None:
    p = sub.add_parser("top", help="the running jobs, live: CPU %%, memory, lease, progress",
                       parents=[parents.inspect])
    p.add_argument("-q", "--queue", help="only this queue's jobs")
    p.add_argument("--once", action="store_true", help="print one view and exit")
    p.add_argument("--interval", "-n", default="2s", help="refresh period (2s: the heartbeat's)")
    p.set_defaults(func=cmd_top)
