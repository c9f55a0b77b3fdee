"""forq run, job, cancel: a supervisor, and one job at a time (forq enqueue: enqueue.py)."""

from __future__ import annotations

import argparse
from typing import Any

from forq import JobNotFound, find_job
from forq.supervisor.cli import enqueue, render
from forq.supervisor.cli.base import (
    DEFAULT_CONFIG,
    Parents,
    emit,
    queue_named,
    redis_for,
)


def cmd_run(args: argparse.Namespace) -> int:
    from forq.supervisor.supervisor import run_supervisor

    return run_supervisor(args.config, log_format=args.log_format,
                          redis_url=getattr(args, "redis", None))


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
    enqueue.register(sub, parents)

    p = sub.add_parser("job", help="show a job's record and history",
                       parents=[parents.inspect, parents.with_config])
    p.add_argument("id")
    p.set_defaults(func=cmd_job)

    p = sub.add_parser("cancel", help="cancel a job (an active one is stopped by its supervisor)",
                       parents=[parents.inspect, parents.with_config])
    p.add_argument("id")
    p.add_argument("-q", "--queue", help="its queue (default: search every queue)")
    p.set_defaults(func=cmd_cancel)
