"""forq dead list | show | requeue | purge: the dead-letter set of a queue; and
forq purge: ended jobs (succeeded or dead) deleted now by state, task and age, as the
reaper's retention trim deletes them (lua/trim.lua: a live or still-needed record stays)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from forq import Job, Queue, find_job
from forq.store.control import KEPT_STATES, bucket_state, parse_trim, purge_call
from forq.supervisor.cli import render, terminal
from forq.supervisor.cli.base import (
    Failure,
    Parents,
    UsageError,
    emit,
    queue_named,
    redis_for,
)
from forq.units import UnitError, parse_duration

REQUEUE_BATCH = 10000  # dead jobs per script call of `--all`
PURGE_PAGE = 500  # ended jobs looked at, then purged, per round trip of `forq purge`


def _dead_row(job: Job) -> dict[str, Any]:
    return {"id": job.id, "task": job.task, "reason": job.reason, "died_at": render.died_at(job),
            "attempts": job.attempts, "crashes": job.crashes}


def cmd_dead_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise UsageError(f"--limit: must be at least 1, got {args.limit}")
    queue = queue_named(args.queue, redis_for(args))
    jobs = queue.dead(limit=args.limit)
    total = queue.redis.zcard(queue.keys.dead)
    if args.json:
        emit({"queue": queue.name, "total": total, "jobs": [_dead_row(j) for j in jobs]})
        return 0
    if not jobs:
        print(f"no dead jobs in queue {queue.name}")
        return 0
    terminal.show(render.dead_grid(jobs), render.dead_table(jobs))
    shown = f"{len(jobs)} of {total}" if total > len(jobs) else f"{total}"
    print(f"\n{shown} dead in queue {queue.name} (oldest first; forq dead show -q {queue.name} ID)")
    return 0


def cmd_dead_show(args: argparse.Namespace) -> int:
    client = redis_for(args)
    if args.queue:
        job = queue_named(args.queue, client).get(args.id)
    else:
        job = find_job(client, args.id)
    if job.state != "dead":
        raise Failure(f"job {job.id} in queue {job.queue} is {job.state}, not dead "
                      f"(forq job {job.id} shows it)")
    if args.json:
        emit(dict(job.to_dict(), died_at=render.died_at(job)))
    else:
        print(render.job(job))
    return 0


def _dead_action(args: argparse.Namespace, verb: str) -> int:
    if args.all and args.ids:
        raise UsageError("give job ids or --all, not both")
    if not args.all and not args.ids:
        raise UsageError(f"say which dead jobs to {verb}: give job ids, or --all for every one")
    queue = queue_named(args.queue, redis_for(args))
    action = queue.requeue_dead if verb == "requeue" else queue.purge_dead
    not_dead: list[str] = []
    if args.ids:
        ids = list(dict.fromkeys(args.ids))
        count, not_dead = action(ids)
    else:
        # In batches, and never more rounds than the dead set had at the start: a
        # requeued job that dies again at once is not chased forever.
        total = queue.redis.zcard(queue.keys.dead)
        count = 0
        with terminal.progress(total, f"{verb} dead jobs of {queue.name}") as advance:
            for _ in range(total // REQUEUE_BATCH + 1):
                n, _missing = action(None, limit=REQUEUE_BATCH)
                count += n
                advance(n)
                if n < REQUEUE_BATCH:
                    break
    done = "requeued" if verb == "requeue" else "purged"
    if args.json:
        emit({"queue": queue.name, done: count, "not_dead": not_dead})
    else:
        where = " to pending" if verb == "requeue" else ""
        print(f"{done} {count} dead job{'s' if count != 1 else ''} of queue {queue.name}{where}")
    if not_dead:
        print(f"forq: not dead in queue {queue.name}, left alone: {' '.join(not_dead)}",
              file=sys.stderr)
        return 1
    return 0


def cmd_dead_requeue(args: argparse.Namespace) -> int:
    return _dead_action(args, "requeue")


def cmd_dead_purge(args: argparse.Namespace) -> int:
    return _dead_action(args, "purge")


def _candidates(queue: Queue, state: str) -> Any:
    """Pages of the ids of `state`: dead from the dead-letter set (it holds dead jobs
    from before retention too), succeeded from the retention index. ZSCAN: a page's
    deletions neither repeat nor skip the rest."""
    client = queue.redis
    if state == "dead":
        zsets = [queue.keys.dead]
    else:
        buckets = sorted(str(b) for b in client.smembers(queue.keys.kept))
        zsets = [queue.keys.kept_bucket(b) for b in buckets if bucket_state(b) == state]
    page: list[str] = []
    for zset in zsets:
        for jid, _score in client.zscan_iter(zset, count=PURGE_PAGE):
            page.append(jid)
            if len(page) == PURGE_PAGE:
                yield page
                page = []
    if page:
        yield page


def purge_ended(queue: Queue, state: str, task: str | None = None,
                older_ms: int | None = None) -> int:
    """Delete the `state` jobs of `queue` (of `task`, ended more than `older_ms` ago).
    Returns how many went."""
    client, purged = queue.redis, 0
    seconds, micros = client.time()
    cutoff = int(seconds) * 1000 + int(micros) // 1000 - (older_ms or 0)
    for page in _candidates(queue, state):
        pipe = client.pipeline(transaction=False)
        for jid in page:
            pipe.hmget(queue.keys.job(jid), "task", "finished_at")
        chosen = [(state, jid) for jid, (jtask, ended) in zip(page, pipe.execute(), strict=True)
                  if (task is None or jtask == task)
                  and (older_ms is None or int(ended or 0) <= cutoff)]
        if chosen:
            result = parse_trim(queue.scripts.run(purge_call(queue.keys, chosen)))
            purged += result.succeeded + result.dead
    return purged


def cmd_purge(args: argparse.Namespace) -> int:
    older_ms = None
    if args.older_than is not None:
        try:
            older_ms = int(parse_duration(args.older_than, where="--older-than") * 1000)
        except UnitError as exc:
            raise UsageError(str(exc)) from None
    queue = queue_named(args.queue, redis_for(args))
    n = purge_ended(queue, args.state, args.task, older_ms)
    if args.json:
        emit({"queue": queue.name, "state": args.state, "purged": n})
    else:
        print(f"purged {n} {args.state} job{'s' if n != 1 else ''} of queue {queue.name}")
    return 0


def register(sub: Any, parents: Parents) -> None:
    listing = [parents.inspect, parents.with_config]
    p = sub.add_parser("dead", help="the dead-letter set: list, show, requeue, purge")
    dsub = p.add_subparsers(dest="dead_command", required=True, metavar="list|show|requeue|purge")
    d = dsub.add_parser("list", help="dead jobs, oldest first", parents=listing)
    d.add_argument("-q", "--queue", required=True)
    d.add_argument("--limit", type=int, default=100, help="show at most this many (100)")
    d.set_defaults(func=cmd_dead_list)
    d = dsub.add_parser("show", help="one dead job in full", parents=listing)
    d.add_argument("-q", "--queue", help="its queue (default: search every queue)")
    d.add_argument("id")
    d.set_defaults(func=cmd_dead_show)
    for name, func, what in (("requeue", cmd_dead_requeue, "back to pending, counts reset"),
                             ("purge", cmd_dead_purge, "delete for good")):
        d = dsub.add_parser(name, help=f"dead jobs {what}", parents=listing)
        d.add_argument("-q", "--queue", required=True)
        d.add_argument("ids", nargs="*", metavar="ID")
        d.add_argument("--all", action="store_true", help="every dead job of the queue")
        d.set_defaults(func=func)
    p = sub.add_parser("purge", parents=listing,
                       help="ended jobs deleted now, by state, task and age (docs/operations/retention.md)")
    p.add_argument("-q", "--queue", required=True)
    p.add_argument("--state", required=True, choices=KEPT_STATES,
                   help="succeeded or dead (a live job is never purged)")
    p.add_argument("--task", help="only this task's jobs")
    p.add_argument("--older-than", metavar="DURATION", help='only those ended before, e.g. "1h"')
    p.set_defaults(func=cmd_purge)
