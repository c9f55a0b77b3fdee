"""forq run, enqueue, job, cancel: a supervisor, and one job at a time."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from forq import JobNotFound, find_job
from forq.supervisor.cli import render
from forq.supervisor.cli.base import (
    DEFAULT_CONFIG,
    Parents,
    UsageError,
    duration_arg,
    emit,
    json_arg,
    queue_named,
    redis_for,
)


def cmd_run(args: argparse.Namespace) -> int:
    from forq.supervisor.supervisor import run_supervisor

    return run_supervisor(args.config, log_format=args.log_format,
                          redis_url=getattr(args, "redis", None))


def cmd_enqueue(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {
        "args": json_arg(args.args, "args", list),
        "kwargs": json_arg(args.kwargs, "kwargs", dict),
        "priority": args.priority,
    }
    if args.delay:
        duration_arg(args.delay, "--delay")
        options["delay"] = args.delay
    if args.expires_in:
        if duration_arg(args.expires_in, "--expires-in") <= 0:
            raise UsageError(f"--expires-in: must be more than 0, got {args.expires_in!r}")
        options["expires_in"] = args.expires_in
    if args.key:
        options["key"] = args.key
    if args.group is not None:
        options["group"] = args.group
    if args.lifo:
        options["lifo"] = True
    queue = queue_named(args.queue, redis_for(args))
    try:
        job = queue.enqueue(args.task, **options)
    except ValueError as exc:  # PayloadError and other refused options
        raise UsageError(str(exc)) from None
    print(job.id)
    if job.fields.get("enqueue_status") == "duplicate":
        print(f"forq: key {args.key!r} is held by live job {job.id}; nothing new enqueued",
              file=sys.stderr)
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    job = find_job(redis_for(args), args.id)
    if args.json:
        emit(job.to_dict())
    else:
        print(render.job(job))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    client = redis_for(args)
    if args.queue:
        queue = queue_named(args.queue, client)
    else:
        queue = queue_named(find_job(client, args.id).queue, client)
    outcome = queue.cancel(args.id)
    if outcome == "missing":
        raise JobNotFound(f"no job {args.id} in queue {queue.name}")
    state = "active" if outcome == "cancelling" else outcome
    if args.json:
        emit({"id": args.id, "queue": queue.name, "outcome": outcome, "state": state})
    elif outcome == "cancelled":
        print(f"cancelled job {args.id} (queue {queue.name})")
    elif outcome == "cancelling":
        print(f"cancelling job {args.id} (queue {queue.name}): it is running; its supervisor "
              "will stop it within one lease extension")
    else:
        print(f"job {args.id} (queue {queue.name}) already {outcome}: nothing to cancel")
    return 0


def register(sub: Any, parents: Parents) -> None:
    p = sub.add_parser("run", help="run a supervisor", parents=[parents.common])
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, help="TOML config file")
    p.add_argument("--log-format", choices=("text", "json"), help="override the config's")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("enqueue", help="enqueue a job; prints its id",
                       parents=[parents.common, parents.with_config])
    p.add_argument("task")
    p.add_argument("--args", help="JSON array of positional arguments")
    p.add_argument("--kwargs", help="JSON object of keyword arguments")
    p.add_argument("-q", "--queue", default="default")
    p.add_argument("--priority", type=int, default=0, help="higher runs first")
    p.add_argument("--delay", help='run after this long, e.g. "30s"')
    p.add_argument("--expires-in", metavar="DURATION",
                   help='not started within this long: never run (dead, "expired before '
                        'start"), e.g. "10m"')
    p.add_argument("--key", help="idempotency key: no second live job with this key")
    p.add_argument("--group", help="group key: at most the queue's group_concurrency jobs "
                                   "of one group run at once")
    p.add_argument("--lifo", action="store_true",
                   help="run before the jobs of its priority already waiting (newest first)")
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("job", help="show a job's record and history",
                       parents=[parents.inspect, parents.with_config])
    p.add_argument("id")
    p.set_defaults(func=cmd_job)

    p = sub.add_parser("cancel", help="cancel a job (an active one is stopped by its supervisor)",
                       parents=[parents.inspect, parents.with_config])
    p.add_argument("id")
    p.add_argument("-q", "--queue", help="its queue (default: search every queue)")
    p.set_defaults(func=cmd_cancel)
