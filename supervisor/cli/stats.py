"""forq stats, supervisors (alias workers), schedules, events: what the cluster is doing,
once or live; and a queue's events settings (`forq events QUEUE --enable/--disable/--keep/
--on-dead`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import redis

from forq import Queue, QueueEvent, known_queues, units
from forq.store.events import KINDS
from forq.supervisor.cli import render, terminal
from forq.supervisor.cli.base import (
    Parents,
    UsageError,
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


def _memory_notes(client: redis.Redis, only: str | None) -> list[str]:
    """Admission by memory, from the live supervisors' heartbeats: their budgets, and
    the jobs refused as over a whole budget that have not run since."""
    from forq.fleet import live_supervisors, memory_view

    view = memory_view(client, live_supervisors(client))
    return render.memory_notes(list(view["budgets"].values()), [
        job for job in view["refused"] if only is None or job["queue"] == only])


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
            for line in _memory_notes(client, args.queue):
                print(line)
        _warn_eviction(client)
        return 0
    interval = duration_arg(args.interval, "--interval", positive=True)
    stats = _stats(client, args.queue)  # an unreachable Redis fails here, once, exit 1
    return terminal.watch(
        lambda: _stats(client, args.queue), stats, interval, as_json=args.json,
        title=lambda _stats: f"forq stats   {time.strftime('%Y-%m-%d %H:%M:%S')}   every "
                             f"{units.age(interval)}   (Ctrl-C to stop)",
        frame=lambda seen: {"time": time.time(), "queues": seen},
        grid=lambda seen: render.stats_grid(seen) if seen else None,
        plain=render.stats_table, stale="the counts are the last read")


def cmd_workers(args: argparse.Namespace) -> int:
    from forq.fleet import live_supervisors

    client = redis_for(args)
    records = live_supervisors(client)
    if args.json:
        emit(records)
        return 0
    if not records or not terminal.interactive():
        print(render.workers_table(records))
    else:
        terminal.show(render.workers_grid(records), "")
        for line in render.supervisor_notes(records):
            print(line)
    for line in _memory_notes(client, None):  # budgets, and jobs over every one
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


# -- forq events ------------------------------------------------------------------------

DEFAULT_LAST = 20  # without --last, --since or --all: the newest this many, then --follow
RETRY_S = 1.0  # --follow through a Redis outage: try again this often


def _line(event: QueueEvent) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.at))
    millis = int(event.at * 1000) % 1000
    parts = [f"{stamp}.{millis:03d}", f"{event.kind:<9}", event.job_id or "-",  # a task's `resumed`: no job's
             event.task or "-"]
    if event.supervisor:
        parts.append(f"on {event.supervisor}")
    parts += [f"{k}={v}" for k, v in event.fields.items()]
    if event.reason:
        parts.append(f"reason: {event.reason}")
    return "  ".join(" ".join(p.split()) for p in parts)  # one line, whatever a reason holds


def _selected(events: Iterator[QueueEvent], jobs: set[str], kinds: set[str]) -> Iterator[QueueEvent]:
    for event in events:
        if (not jobs or event.job_id in jobs) and (not kinds or event.kind in kinds):
            yield event


def _follow(queue: Queue, args: argparse.Namespace, timeout: float | None) -> Iterator[QueueEvent]:
    """The events asked for, then (with --follow) each new one, through Redis outages:
    a broken read is tried again from the last event printed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    since, last = args.since or "0", args.last
    if args.since is None and last is None and not args.all:
        last = DEFAULT_LAST
    warned = False
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            for event in queue.events(since=since, last=last, follow=args.follow, timeout=left):
                warned = False
                since, last = event.stream_id, None
                yield event
            return
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if not args.follow or (deadline is not None and time.monotonic() >= deadline):
                raise
            if not warned:
                print(f"forq: cannot reach Redis: {' '.join(str(exc).split())} (retrying)",
                      file=sys.stderr, flush=True)
                warned = True
            time.sleep(RETRY_S)  # then again: from the last event printed, if any


def _settings(queue: Queue, args: argparse.Namespace) -> int:
    if args.enable and args.disable:
        raise UsageError("--enable and --disable: give one")
    if args.keep is not None and args.disable:
        raise UsageError("--keep is for --enable (a queue without events keeps none)")
    try:
        if args.enable or args.keep is not None:
            queue.set_events(True, keep=args.keep)
        elif args.disable:
            queue.set_events(False)
        if args.on_dead is not None:
            queue.set_on_dead(None if args.on_dead.strip().lower() == "none" else args.on_dead)
    except ValueError as exc:
        raise UsageError(str(exc).replace("keep must", "--keep must")
                         .replace("on_dead must", "--on-dead must")) from None
    info = {"queue": queue.name, **queue.event_settings()}
    if args.json:
        emit(info)
    else:
        state = f"on, about {info['keep']:,} kept" if info["events"] else "off"
        print(f"queue {queue.name}: events {state}; on_dead "
              f"{info['on_dead'] or 'none'}")
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    queue = queue_named(args.queue, redis_for(args))
    if args.enable or args.disable or args.keep is not None or args.on_dead is not None:
        return _settings(queue, args)
    if sum(x is not None and x is not False for x in (args.last, args.since, args.all)) > 1:
        raise UsageError("--last, --since and --all: give one")
    if args.last is not None and args.last < 0:
        raise UsageError(f"--last must be 0 or more, got {args.last}")
    bad = sorted(set(args.event or ()) - set(KINDS))
    if bad:
        raise UsageError(f"--event {bad[0]!r}: not a kind of event (one of {', '.join(KINDS)})")
    timeout = None
    if args.timeout is not None:
        if not args.follow:
            raise UsageError("--timeout is for --follow")
        timeout = duration_arg(args.timeout, "--timeout")
    if not queue.event_settings()["events"]:
        print(f"forq: events are off for queue {queue.name}: nothing new is written "
              f"(forq events {queue.name} --enable)", file=sys.stderr, flush=True)
    events = _selected(_follow(queue, args, timeout), set(args.job or ()), set(args.event or ()))
    for event in events:
        if args.json:
            print(json.dumps(event.to_dict(), ensure_ascii=False), flush=True)
        else:
            print(_line(event), flush=True)
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

    p = sub.add_parser(
        "events", help="a queue's events (--follow: as they come); its events settings",
        parents=[parents.inspect, parents.with_config],
        description="The queue's events, oldest first: the newest 20 kept (or --last N, "
                    "--since ID, --all), then with --follow each new one as it happens. "
                    f"Kinds: {', '.join(KINDS)}. --enable/--disable/--keep/--on-dead change "
                    "the queue's settings instead (kept in Redis, for every supervisor).")
    p.add_argument("queue")
    p.add_argument("-f", "--follow", action="store_true", help="then wait for new ones")
    p.add_argument("--timeout", metavar="DURATION", help="with --follow: stop after this long")
    p.add_argument("--last", type=int, metavar="N", help=f"the newest N kept (default {DEFAULT_LAST})")
    p.add_argument("--since", metavar="ID", help="those after this stream id (an event's)")
    p.add_argument("--all", action="store_true", help="every one kept")
    p.add_argument("--job", action="append", metavar="ID", help="only this job's (repeat)")
    p.add_argument("--event", action="append", metavar="KIND", help="only this kind (repeat)")
    p.add_argument("--enable", action="store_true", help="write the queue's events")
    p.add_argument("--disable", action="store_true",
                   help="write none, and delete the stream (its memory)")
    p.add_argument("--keep", type=int, metavar="N", help="with --enable: keep about N (1 to 1,000,000)")
    p.add_argument("--on-dead", metavar="TASK|none",
                   help="enqueue TASK on the queue when one of its jobs dies (none: nothing)")
    p.set_defaults(func=cmd_events)
