"""forq jobs: find a queue's jobs by state, task, error, age, group or argument, and act on
all of them (requeue, cancel, purge, promote) with a count first (issue 29 item 6).

The walk is `forq.store.finder`'s: pages of bounded work over the state's sorted set,
never KEYS or a SCAN. Without --yes an action only counts what it would touch.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from forq import Job, Queue
from forq.store.finder import ACTIONS, FINDABLE, JobFilter
from forq.supervisor.cli import render, terminal
from forq.supervisor.cli.base import Parents, UsageError, emit, queue_named, redis_for

COUNT_PAGE = 1000  # matches per page while counting before an action


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    found = {"task": args.task, "error": args.error, "since": args.since,
             "before": args.before, "args_contains": args.args_contains, "group": args.group}
    return {name: value for name, value in found.items() if value is not None}


def _described(args: argparse.Namespace) -> str:
    parts = [f"{args.state}"]
    for flag, value in (("task", args.task), ("error", args.error), ("since", args.since),
                        ("before", args.before), ("args containing", args.args_contains),
                        ("group", args.group)):
        if value is not None:
            parts.append(f"{flag} {value!r}" if flag != "since" else f"since {value} ago")
    return ", ".join(parts)


def _row(job: Job) -> dict[str, Any]:
    f = job.fields
    return {"id": job.id, "task": job.task, "state": job.state, "attempts": job.attempts,
            "crashes": job.crashes, "reason": job.reason, "enqueued_at": f.get("enqueued_at"),
            "run_at": f.get("run_at"), "finished_at": f.get("finished_at"),
            "priority": f.get("priority"), "group": f.get("group")}


def cmd_jobs(args: argparse.Namespace) -> int:
    actions = [name for name in ACTIONS if getattr(args, name)]
    if len(actions) > 1:
        raise UsageError(f"one action at a time, not {' and '.join('--' + a for a in actions)}")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit: must be at least 1, got {args.limit}")
    try:
        JobFilter(args.state, **_filters(args))  # bad filters: a usage error, before Redis
        if actions and args.state not in ACTIONS[actions[0]]:
            raise ValueError(f"--{actions[0]} acts on {' or '.join(ACTIONS[actions[0]])} "
                             f"jobs, not {args.state} (--state)")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    queue = queue_named(args.queue, redis_for(args))
    if actions:
        return _act(args, queue, actions[0])
    return _list(args, queue)


def _list(args: argparse.Namespace, queue: Queue) -> int:
    limit = args.limit or 50
    jobs: list[Job] = []
    cursor = args.cursor
    try:
        while True:
            page = queue.find(args.state, cursor=cursor, count=min(100, limit - len(jobs)),
                              **_filters(args))
            jobs += page.jobs
            cursor = page.cursor
            if cursor is None or len(jobs) >= limit:
                break
    except ValueError as exc:  # a cursor of another walk
        raise UsageError(str(exc)) from None
    if args.json:
        emit({"queue": queue.name, "state": args.state, "jobs": [_row(j) for j in jobs],
              "cursor": cursor})
        return 0
    if not jobs:
        print(f"no jobs in queue {queue.name} match ({_described(args)})")
    else:
        terminal.show(render.found_grid(jobs), render.table(*render.found_grid(jobs)))
    if cursor is not None:
        print(f"\nmore may match: forq jobs {queue.name} ... --cursor '{cursor}'")
    elif args.state == "pending" and args.group is None:
        grouped = int(queue.redis.get(queue.keys.groups_pending) or 0)
        if grouped:
            print(f"\n{grouped} more pending in their groups' sets: list them with --group G")
    return 0


def _count(args: argparse.Namespace, queue: Queue) -> int:
    count = 0
    cursor = None
    with terminal.progress(1, "counting") as advance:
        while True:
            page = queue.find(args.state, cursor=cursor, count=COUNT_PAGE, **_filters(args))
            count += len(page.jobs)
            advance(0, note=f"{count} so far")
            cursor = page.cursor
            if cursor is None or (args.limit is not None and count >= args.limit):
                return min(count, args.limit) if args.limit is not None else count


def _act(args: argparse.Namespace, queue: Queue, action: str) -> int:
    what = f"{action} {{n}} {args.state} job{{s}} of queue {queue.name} ({_described(args)})"
    if not args.yes:
        n = _count(args, queue)
        said = what.format(n=n, s="" if n == 1 else "s")
        if args.json:
            emit({"queue": queue.name, "action": action, "matched": n, "done": 0})
        print(f"forq: would {said}; nothing done: add --yes to do it", file=sys.stderr)
        return 1 if n else 0
    result = queue.bulk(action, args.state, limit=args.limit, **_filters(args))
    if args.json:
        emit({"queue": queue.name, **result.to_dict()})
        return 0
    past = {"requeue": "requeued", "purge": "purged", "cancel": "cancelled",
            "promote": "promoted"}[action]
    print(f"{past} {result.done} of {result.matched} matching job"
          f"{'' if result.matched == 1 else 's'} ({_described(args)}) of queue {queue.name}")
    if result.skipped:
        print(f"{result.skipped} had changed before their turn (another state, or the record "
              "gone) and were left alone")
    if result.more:
        print(f"stopped at --limit {args.limit}: more may match")
    if action == "cancel" and args.state == "active" and result.done:
        print("active jobs are stopped by their supervisors within one lease extension")
    return 0


def register(sub: Any, parents: Parents) -> None:
    p = sub.add_parser(
        "jobs", help="find jobs by state, task, error, age or argument; act on all of them",
        parents=[parents.inspect, parents.with_config],
        description="Lists the jobs of QUEUE in --state that pass every filter given, in "
                    "the state's order (pending: claim order; scheduled: due; dead: died). "
                    "The walk reads a bounded page at a time, so it may take a while on a "
                    "huge set but never stalls Redis. With an action, it first counts the "
                    "matches and does nothing without --yes. succeeded and cancelled search "
                    "the queue's recently finished index (10,000 newest).")
    p.add_argument("queue")
    p.add_argument("--state", default="pending", choices=tuple(FINDABLE),
                   help="which jobs (pending)")
    p.add_argument("--task", help="this task name exactly")
    p.add_argument("--error", metavar="REGEX",
                   help="a Python regular expression searched in the job's reason (dead "
                        "reason, else its last error's type and message)")
    p.add_argument("--since", metavar="DURATION",
                   help='got to its state at most this long ago, e.g. "1h" (dead: died; '
                        "active: started; others: enqueued)")
    p.add_argument("--before", metavar="DURATION", help="got to its state longer ago than this")
    p.add_argument("--args-contains", metavar="TEXT",
                   help="its args or kwargs JSON holds this text (plain, not a pattern)")
    p.add_argument("--group", help="its group (pending: walks the group's own set)")
    p.add_argument("--limit", type=int,
                   help="list at most this many (50); act on at most this many (all)")
    p.add_argument("--cursor", help="go on from where a listing stopped")
    for name, states in ACTIONS.items():
        p.add_argument(f"--{name}", action="store_true",
                       help=f"{name} every match ({' or '.join(states)} jobs)")
    p.add_argument("--yes", action="store_true", help="do the action (else: count only)")
    p.set_defaults(func=cmd_jobs)
