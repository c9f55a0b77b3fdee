"""forq stats, supervisors (alias workers), schedules: what the cluster is doing, once
or live."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any

import redis

from forq import known_queues, units
from forq.supervisor.cli import render, terminal
from forq.supervisor.cli.base import (
    Parents,
    config_of,
    duration_arg,
    emit,
    queue_named,
    redis_for,
    redis_now,
)


def _stats(client: redis.Redis, only: str | None) -> dict[str, dict[str, Any]]:
    names = [only] if only else known_queues(client)
    return {name: queue_named(name, client).stats() for name in names}


def _warn_eviction(client: redis.Redis) -> None:
    """An evicting Redis deletes jobs silently: say so on stderr (see redis_checks)."""
    from forq.supervisor.redis_io.checks import eviction_problem

    policy, _unknown = eviction_problem(client)
    if policy:
        print(f"warning: Redis maxmemory-policy is {policy}: it may evict (delete) jobs when "
              "it fills up; set maxmemory-policy noeviction", file=sys.stderr)


def cmd_stats(args: argparse.Namespace) -> int:
    client = redis_for(args)
    if args.queue:
        queue_named(args.queue, client)  # a bad name is a usage error before anything is read
    if not args.watch:
        stats = _stats(client, args.queue)
        if args.json:
            emit(stats)
        else:
            terminal.show(render.stats_grid(stats) if stats else None, render.stats_table(stats))
        _warn_eviction(client)
        return 0
    interval = duration_arg(args.interval, "--interval", positive=True)
    stats = _stats(client, args.queue)  # an unreachable Redis fails here, once, exit 1
    error = None
    live = terminal.Live() if not args.json and terminal.interactive() else None
    try:
        with live or contextlib.nullcontext():
            while True:
                head = f"forq stats   {time.strftime('%Y-%m-%d %H:%M:%S')}   every " \
                       f"{units.age(interval)}   (Ctrl-C to stop)"
                if error:
                    head += f"\ncannot reach Redis: {error} (retrying; the counts are the last read)"
                if args.json:  # one compact object per line, for `| jq` or a log
                    frame: dict[str, Any] = {"time": time.time(), "queues": stats}
                    if error:
                        frame["error"] = error
                    print(json.dumps(frame), flush=True)
                elif live is not None:
                    live.update(render.stats_grid(stats) if stats else None,
                                render.stats_table(stats), head)
                else:  # not a terminal: plain frames one after another, no escape codes
                    sys.stdout.write(f"{head}\n\n{render.stats_table(stats)}\n\n")
                    sys.stdout.flush()
                time.sleep(interval)
                try:  # keep watching through a Redis outage
                    stats, error = _stats(client, args.queue), None
                except redis.RedisError as exc:
                    error = " ".join(str(exc).split())
    except KeyboardInterrupt:
        if not args.json and live is None:
            print()
        return 0


def cmd_workers(args: argparse.Namespace) -> int:
    from forq.fleet import live_supervisors

    records = live_supervisors(redis_for(args))
    if args.json:
        emit(records)
        return 0
    if not records or not terminal.interactive():
        print(render.workers_table(records))
        return 0
    terminal.show(render.workers_grid(records), "")
    for line in render.supervisor_notes(records):
        print(line)
    return 0


def cmd_schedules(args: argparse.Namespace) -> int:
    from forq.fleet import schedule_rows
    from forq.supervisor.redis_io.scheduler import config_defs

    client = redis_for(args)
    now = redis_now(client)
    defs = config_defs(config_of(args).schedules, now) if args.config else None
    rows = schedule_rows(client, now, defs)
    if args.json:
        emit(rows)
    else:
        terminal.show(render.schedules_grid(rows, now) if rows else None,
                      render.schedules_table(rows, now, from_config=args.config is not None))
    return 0


def register(sub: Any, parents: Parents) -> None:
    p = sub.add_parser("stats", help="counts per queue",
                       parents=[parents.inspect, parents.with_config])
    p.add_argument("-q", "--queue", help="only this queue")
    p.add_argument("--watch", "-w", action="store_true", help="refresh in place until Ctrl-C")
    p.add_argument("--interval", "-n", default="2s", help="refresh period for --watch (2s)")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("supervisors", aliases=["workers"],
                       help="live supervisors and the handler code each serves",
                       parents=[parents.inspect, parents.with_config])
    p.set_defaults(func=cmd_workers)

    p = sub.add_parser("schedules", help="cron schedules: last and next fire",
                       parents=[parents.inspect])
    p.add_argument("--config", "-c", metavar="PATH",
                   help="the schedules of this config (default: those the running "
                        "supervisors published in Redis)")
    p.set_defaults(func=cmd_schedules)
