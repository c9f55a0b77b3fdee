"""forq enqueue: one job with every option `Queue.enqueue` takes, or many jobs from a
JSON file (`Queue.enqueue_many`), or those jobs as one batch (`Queue.batch`).

Each flag is the API's option of the same name (``--max-attempts`` is
``max_attempts=``), checked here only where the command line has its own form (JSON,
a date); the API checks the rest and its refusal is the one-line usage error. With
``--jobs`` each job carries its own options, exactly as an item of ``enqueue_many``:
a per-job flag beside it would be ambiguous, so it is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from forq import Job
from forq.supervisor.cli.base import (
    Parents,
    UsageError,
    duration_arg,
    emit,
    json_arg,
    queue_named,
    redis_for,
    size_arg,
)

MAX_JOBS_FILE = 256 << 20  # --jobs: a file or stdin larger than this is refused unread

# per-job flags → the API's option; what kind of value each takes
DURATIONS = {"delay": "--delay", "unique_for": "--unique-for", "timeout": "--timeout",
             "result_ttl": "--result-ttl"}
SIZES = {"memory_limit": "--memory-limit", "max_result_bytes": "--max-result-bytes"}
TIMES = {"run_at": "--run-at", "expire_at": "--expire-at"}
PLAIN = {"key": "--key", "job_id": "--job-id", "group": "--group",
         "max_attempts": "--max-attempts", "max_crashes": "--max-crashes"}
FLAGS = {"args": "--args", "kwargs": "--kwargs", "priority": "--priority",
         "expires_in": "--expires-in", "backoff": "--backoff", "idempotent": "--idempotent",
         "depends_on": "--depends-on", "allow_failure": "--allow-failure", "lifo": "--lifo",
         **DURATIONS, **SIZES, **TIMES, **PLAIN}


def when_arg(text: str, option: str) -> float:
    """A moment: Unix seconds, or an ISO 8601 date and time (local time unless it names
    its zone; a trailing Z is UTC)."""
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):
            return seconds
    iso = text.strip()
    if iso[-1:] in ("Z", "z"):  # Python 3.10's fromisoformat does not read Z
        iso = iso[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(iso).timestamp()
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"{option}: expected a date and time such as "
                         f'"2026-11-01T09:00:00+01:00" or Unix seconds, got {text!r}') from None


def job_options(args: argparse.Namespace) -> dict[str, Any]:
    """The per-job flags given, as `Queue.enqueue`'s options."""
    options: dict[str, Any] = {}
    if args.args is not None:
        options["args"] = json_arg(args.args, "args", list)
    if args.kwargs is not None:
        options["kwargs"] = json_arg(args.kwargs, "kwargs", dict)
    if args.priority is not None:
        options["priority"] = args.priority
    for name, flag in DURATIONS.items():
        value = getattr(args, name)
        if value is not None:
            duration_arg(value, flag)
            options[name] = value
    if args.expires_in is not None:
        if duration_arg(args.expires_in, "--expires-in") <= 0:
            raise UsageError(f"--expires-in: must be more than 0, got {args.expires_in!r}")
        options["expires_in"] = args.expires_in
    for name, flag in SIZES.items():
        value = getattr(args, name)
        if value is not None:
            size_arg(value, flag)
            options[name] = value
    for name, flag in TIMES.items():
        value = getattr(args, name)
        if value is not None:
            options[name] = when_arg(value, flag)
    for name, flag in PLAIN.items():
        value = getattr(args, name)
        if value == "":  # the API reads an empty job id or key as "none given"
            raise UsageError(f"{flag} must not be empty")
        if value is not None:
            options[name] = value
    if args.backoff is not None:
        options["backoff"] = json_arg(args.backoff, "backoff", dict)
    if args.idempotent:
        options["idempotent"] = True
    if args.depends_on:
        options["depends_on"] = args.depends_on
    if args.allow_failure:
        options["allow_failure"] = True
    if args.lifo:
        options["lifo"] = True
    return options


def read_jobs(source: str) -> list[Any]:
    """--jobs FILE (or - for stdin): a JSON array of job objects."""
    where = "stdin" if source == "-" else source
    try:
        if source == "-":
            data = sys.stdin.buffer.read(MAX_JOBS_FILE + 1)
        else:
            with open(Path(source), "rb") as f:
                data = f.read(MAX_JOBS_FILE + 1)
    except OSError as exc:
        raise UsageError(f"--jobs: cannot read {where}: {exc.strerror or exc}") from None
    if len(data) > MAX_JOBS_FILE:
        raise UsageError(f"--jobs {where}: over {MAX_JOBS_FILE >> 20} MiB; split it")
    try:
        jobs = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"--jobs {where}: not valid JSON: {exc}") from None
    if not isinstance(jobs, list):
        raise UsageError(f"--jobs {where}: must be a JSON array of jobs (objects with task "
                         f"and options), got {type(jobs).__name__}")
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            raise UsageError(f"--jobs {where}: jobs[{i}] must be an object with task and "
                             f"options, got {type(job).__name__}")
    return jobs


def callback_arg(text: str | None, option: str) -> Any:
    """--on-success / --on-complete: a task name, or a JSON object with task and options."""
    if text is None or not text.lstrip().startswith("{"):
        return text
    return json_arg(text, option.lstrip("-"), dict)


def _described(job: Job, task: str) -> dict[str, Any]:
    return {"id": job.id, "queue": job.queue, "task": task,
            "status": job.fields.get("enqueue_status")}


def _refused(where: str, exc: Exception) -> UsageError:
    return UsageError(f"{where}{exc}" if where else str(exc))


def cmd_enqueue(args: argparse.Namespace) -> int:
    options = job_options(args)
    batch_flags = [flag for flag, value in (("--on-success", args.on_success),
                                            ("--on-complete", args.on_complete),
                                            ("--batch-id", args.batch_id)) if value is not None]
    if args.jobs is None:
        if args.task is None:
            raise UsageError("enqueue: the task name is missing (or give --jobs FILE)")
        if args.batch or batch_flags:
            raise UsageError(f"{(['--batch'] if args.batch else batch_flags)[0]} needs --jobs "
                             "FILE (the batch's jobs)")
        return _enqueue_one(args, options)
    if args.task is not None:
        raise UsageError(f"enqueue: give a TASK or --jobs, not both (got {args.task!r})")
    if options:
        flag = FLAGS[next(iter(options))]
        raise UsageError(f"{flag} is an option of one job: with --jobs, put it in each job's "
                         "object")
    if batch_flags and not args.batch:
        raise UsageError(f"{batch_flags[0]} needs --batch")
    if args.batch and args.durable is not None:
        raise UsageError("--durable/--no-durable: a batch is opened as one script call; "
                         "it has no durability wait")
    jobs = read_jobs(args.jobs)
    queue = queue_named(args.queue, redis_for(args))
    where = f"--jobs {'stdin' if args.jobs == '-' else args.jobs}: "
    if args.batch:
        try:
            batch = queue.batch(jobs, callback_arg(args.on_success, "--on-success"),
                                callback_arg(args.on_complete, "--on-complete"),
                                batch_id=args.batch_id)
        except ValueError as exc:
            raise _refused(where, exc) from None
        if args.json:
            emit({"batch": batch.id, "queue": batch.queue, "members": batch.member_ids})
        else:
            print(batch.id)
        return 0
    if not jobs:
        raise UsageError(f"{where}no jobs in it")
    try:
        handles = queue.enqueue_many(jobs, durable=args.durable)
    except ValueError as exc:
        raise _refused(where, exc) from None
    described = [_described(job, spec.get("task", "")) for job, spec in
                 zip(handles, jobs, strict=True)]
    if args.json:
        emit(described)
    else:
        for job in described:
            print(job["id"])
        for i, job in enumerate(described):
            if job["status"] == "duplicate":
                print(f"forq: jobs[{i}]: key {jobs[i].get('key')!r} is held by live job "
                      f"{job['id']}; nothing new enqueued", file=sys.stderr)
    return 0


def _enqueue_one(args: argparse.Namespace, options: dict[str, Any]) -> int:
    queue = queue_named(args.queue, redis_for(args))
    if args.durable is not None:
        options["durable"] = args.durable
    try:
        job = queue.enqueue(args.task, **options)
    except ValueError as exc:  # PayloadError and other refused options
        raise UsageError(str(exc)) from None
    if args.json:
        emit(_described(job, args.task))
    else:
        print(job.id)
    if job.fields.get("enqueue_status") == "duplicate":
        print(f"forq: key {args.key!r} is held by live job {job.id}; nothing new enqueued",
              file=sys.stderr)
    return 0


def register(sub: Any, parents: Parents) -> None:
    p = sub.add_parser(
        "enqueue", help="enqueue a job (or --jobs FILE: many, or a --batch); prints its id",
        parents=[parents.inspect, parents.with_config],
        description="Enqueue one job with any option of Queue.enqueue, or the jobs of a JSON "
                    "file (an array of objects with task and the same options, as "
                    "Queue.enqueue_many takes), or those jobs as one batch (Queue.batch). "
                    "Durations: 30s, 1m30s, 250ms; sizes: 64MiB, 1GB; times: ISO 8601 "
                    "(local unless it has a zone) or Unix seconds.")
    p.add_argument("task", nargs="?", help="the task name (not with --jobs)")
    p.add_argument("-q", "--queue", default="default")
    p.add_argument("--args", help="JSON array of positional arguments")
    p.add_argument("--kwargs", help="JSON object of keyword arguments")
    p.add_argument("--priority", type=int, help="higher runs first (-1000..1000, default 0)")
    p.add_argument("--delay", metavar="DURATION", help='run after this long, e.g. "30s"')
    p.add_argument("--run-at", metavar="TIME", help="run at this time")
    p.add_argument("--expires-in", metavar="DURATION",
                   help='not started within this long: never run (dead, "expired before '
                        'start"), e.g. "10m"')
    p.add_argument("--expire-at", metavar="TIME", help="not started by this time: never run")
    p.add_argument("--key", help="idempotency key: no second live job with this key")
    p.add_argument("--unique-for", metavar="DURATION",
                   help="keep the --key this long after the job finished")
    p.add_argument("--job-id", metavar="ID", help="the job's id (default: 20 random hex digits)")
    p.add_argument("--max-attempts", type=int, metavar="N", help="runs before it is dead")
    p.add_argument("--max-crashes", type=int, metavar="N", help="crashes before it is dead")
    p.add_argument("--timeout", metavar="DURATION", help="stop the job after this long")
    p.add_argument("--memory-limit", metavar="SIZE", help='its memory limit, e.g. "512MiB"')
    p.add_argument("--result-ttl", metavar="DURATION", help="keep its result this long")
    p.add_argument("--max-result-bytes", metavar="SIZE", help="the largest result it may return")
    p.add_argument("--backoff", metavar="JSON",
                   help='retry backoff, e.g. \'{"base": "1s", "factor": 2, "max": "10m", '
                        '"jitter": 0.2}\'')
    p.add_argument("--idempotent", action="store_true",
                   help="record its completion before its ack: a lost ack never runs it again")
    p.add_argument("--group", help="group key: at most the queue's group_concurrency jobs "
                                   "of one group run at once")
    p.add_argument("--depends-on", metavar="ID", action="append",
                   help="run only after this job succeeded (repeat for several)")
    p.add_argument("--lifo", action="store_true",
                   help="run before the jobs of its priority already waiting (newest first)")
    p.add_argument("--allow-failure", action="store_true",
                   help="with --depends-on: run once they ended, whether they succeeded or not")
    p.add_argument("--durable", action=argparse.BooleanOptionalAction, default=None,
                   help="wait until a replica holds the job (--no-durable: never wait; "
                        "default: the queue's min_replicas)")
    p.add_argument("--jobs", metavar="FILE",
                   help='enqueue the jobs of this JSON file (- for stdin): [{"task": ..., '
                        '"args": [...], ...}, ...]; prints one id per line')
    p.add_argument("--batch", action="store_true",
                   help="with --jobs: open them as one batch; prints the batch id")
    p.add_argument("--on-success", metavar="TASK|JSON",
                   help="with --batch: enqueued once every member succeeded")
    p.add_argument("--on-complete", metavar="TASK|JSON",
                   help="with --batch: enqueued once every member ended")
    p.add_argument("--batch-id", metavar="ID", help="with --batch: the batch's id")
    p.set_defaults(func=cmd_enqueue)
