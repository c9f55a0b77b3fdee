"""forq promote, priority, reschedule: change one job before it runs (issue 29 item 5).

Each is one script call (lua/promote.lua, set_priority.lua, reschedule.lua): atomic, and
refused with the reason when the job is not in a state it applies to (exit 1, one line).
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from forq import Queue, find_job
from forq.payload import checked_priority
from forq.supervisor.cli.base import (
    Parents,
    UsageError,
    duration_arg,
    emit,
    queue_named,
    redis_for,
)
from forq.supervisor.cli.enqueue import when_arg


def _queue_of(args: argparse.Namespace) -> Queue:
    """-q QUEUE, else the queue the job is found in (one round trip over the queues)."""
    client = redis_for(args)
    if args.queue:
        return queue_named(args.queue, client)
    return queue_named(find_job(client, args.id).queue, client)


def _report(args: argparse.Namespace, queue: Queue, state: str, said: str,
            **extra: Any) -> int:
    if args.json:
        emit({"id": args.id, "queue": queue.name, "state": state, **extra})
    else:
        print(f"job {args.id} (queue {queue.name}): {said}")
    return 0


def cmd_promote(args: argparse.Namespace) -> int:
    queue = _queue_of(args)
    state = queue.promote(args.id)
    return _report(args, queue, state, "promoted: pending now, it runs at the next free slot")


def cmd_priority(args: argparse.Namespace) -> int:
    try:
        checked_priority(args.priority)
    except ValueError as exc:  # PayloadError: out of range
        raise UsageError(str(exc)) from None
    queue = _queue_of(args)
    state = queue.set_priority(args.id, args.priority)
    return _report(args, queue, state, f"priority {args.priority} ({state})",
                   priority=args.priority)


def cmd_reschedule(args: argparse.Namespace) -> int:
    if (args.at is None) == (args.delay is None):
        raise UsageError("give the new time with --at TIME or --in DURATION, one of them")
    options: dict[str, Any] = {}
    if args.at is not None:
        options["at"] = when_arg(args.at, "--at")
    else:
        options["delay"] = duration_arg(args.delay, "--in")
    queue = _queue_of(args)
    try:
        state = queue.reschedule(args.id, **options)
    except ValueError as exc:  # PayloadError: a time out of range
        raise UsageError(str(exc)) from None
    run_at = int(queue.get(args.id).fields.get("run_at") or 0) / 1000
    when = dt.datetime.fromtimestamp(run_at).astimezone().isoformat(timespec="seconds")
    said = f"due {when}" if state == "scheduled" else "due now: pending"
    return _report(args, queue, state, said, run_at=run_at)


def register(sub: Any, parents: Parents) -> None:
    options = [parents.inspect, parents.with_config]
    p = sub.add_parser("promote", help="run a scheduled job (delayed, or waiting to retry) now",
                       parents=options)
    p.add_argument("id")
    p.add_argument("-q", "--queue", help="its queue (default: search every queue)")
    p.set_defaults(func=cmd_promote)

    p = sub.add_parser("priority", help="change a pending, scheduled or waiting job's priority",
                       parents=options,
                       description="A pending job moves to the tail of its new priority at "
                                   "once (the head, for a job enqueued with lifo).")
    p.add_argument("id")
    p.add_argument("priority", type=int, help="an integer in [-1000, 1000]; higher runs first")
    p.add_argument("-q", "--queue", help="its queue (default: search every queue)")
    p.set_defaults(func=cmd_priority)

    p = sub.add_parser("reschedule", help="give a pending or scheduled job a new run time",
                       parents=options,
                       description="A time not in the future makes a scheduled job pending "
                                   "now. A job waiting on its dependencies runs when they "
                                   "end: it cannot be rescheduled.")
    p.add_argument("id")
    p.add_argument("--at", metavar="TIME",
                   help="ISO 8601 (no offset: local time; Z: UTC) or Unix seconds")
    p.add_argument("--in", dest="delay", metavar="DURATION", help='from now, e.g. "30m"')
    p.add_argument("-q", "--queue", help="its queue (default: search every queue)")
    p.set_defaults(func=cmd_reschedule)
