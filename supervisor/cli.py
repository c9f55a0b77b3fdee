"""The `forq` command: run a supervisor, enqueue, and look at what is going on.

    forq run [--config PATH]
    forq enqueue TASK [--args JSON] [--kwargs JSON] [-q QUEUE] [--priority N] [--delay 30s] [--key KEY]
    forq stats [-q QUEUE] [--json] [--watch [--interval 2s]]
    forq job ID [--json]
    forq dead list|show|requeue|purge -q QUEUE [ID...|--all] [--json]
    forq workers [--json]
    forq schedules [--config PATH] [--json]
    forq web [--config PATH] [--listen 127.0.0.1:8080] [--read-only]
    forq cancel ID [-q QUEUE] [--json]
    forq limit QUEUE [--rate 50/s|none] [--max-in-flight N|none] [--json]
    forq config check PATH

Redis: ``--redis URL`` (before or after the command), else ``$FORQ_REDIS_URL``,
else the URL of the config given with ``--config``, else redis://127.0.0.1:6379/0.

Every error is one line on stderr and a non-zero exit, never a traceback:
2 for a usage or config mistake (bad flag, bad JSON, bad duration or rate),
1 for a runtime failure (Redis unreachable, unknown job id, some of the given
ids were not dead). ``FORQ_DEBUG=1`` shows the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import redis

from forq import ForqError, Job, JobNotFound, Queue, find_job, known_queues
from forq.connection import connect
from forq.supervisor import render, terminal
from forq.units import UnitError, parse_duration, parse_rate

DEFAULT_CONFIG = "/etc/forq/forq.toml"
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: `stats --watch` redraws in place


class UsageError(Exception):
    """A mistake in the command line: exit code 2."""


class Failure(Exception):
    """A runtime failure already worded for the user: exit code 1."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (pointing at --help), not usage + error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


# -- helpers -----------------------------------------------------------------------


def _client(args: argparse.Namespace) -> redis.Redis:
    """--redis, else FORQ_REDIS_URL, else the --config file's URL, else the default."""
    url = getattr(args, "redis", None) or os.environ.get("FORQ_REDIS_URL") or None
    password = None
    if getattr(args, "config", None):
        config = _config(args)
        url = url or config.redis_url
        password = config.redis_password
    try:
        return connect(url, password=password)
    except ValueError as exc:
        raise UsageError(f"bad Redis URL: {exc}") from None


def _config(args: argparse.Namespace) -> Any:
    cached = getattr(args, "_loaded_config", None)
    if cached is None:
        from forq.supervisor.config import ConfigError, load_config

        try:
            cached = load_config(args.config)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        args._loaded_config = cached
    return cached


def _queue(name: str, client: redis.Redis) -> Queue:
    try:
        return Queue(name, redis=client)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _json_arg(text: str | None, what: str, kind: type) -> Any:
    if text is None:
        return kind()
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--{what} is not valid JSON: {exc}") from None
    if not isinstance(value, kind):
        raise UsageError(f"--{what} must be a JSON {'array' if kind is list else 'object'}, "
                         f"got {type(value).__name__}")
    return value


def _emit(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def _redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6


# -- run, enqueue, job -------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from forq.supervisor.supervisor import run_supervisor

    return run_supervisor(args.config, log_format=args.log_format,
                          redis_url=getattr(args, "redis", None))


def cmd_enqueue(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {
        "args": _json_arg(args.args, "args", list),
        "kwargs": _json_arg(args.kwargs, "kwargs", dict),
        "priority": args.priority,
    }
    if args.delay:
        try:
            parse_duration(args.delay, where="--delay")
        except UnitError as exc:
            raise UsageError(str(exc)) from None
        options["delay"] = args.delay
    if args.key:
        options["key"] = args.key
    queue = _queue(args.queue, _client(args))
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
    job = find_job(_client(args), args.id)
    if args.json:
        _emit(job.to_dict())
    else:
        print(render.job(job))
    return 0


# -- stats ---------------------------------------------------------------------------


def _stats(client: redis.Redis, only: str | None) -> dict[str, dict[str, Any]]:
    names = [only] if only else known_queues(client)
    return {name: _queue(name, client).stats() for name in names}


def _warn_eviction(client: redis.Redis) -> None:
    """An evicting Redis deletes jobs silently: say so on stderr (see redis_checks)."""
    from forq.supervisor.redis_checks import eviction_problem

    policy, _unknown = eviction_problem(client)
    if policy:
        print(f"warning: Redis maxmemory-policy is {policy}: it may evict (delete) jobs when "
              "it fills up; set maxmemory-policy noeviction", file=sys.stderr)


def cmd_stats(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.queue:
        _queue(args.queue, client)  # a bad name is a usage error before anything is read
    if not args.watch:
        stats = _stats(client, args.queue)
        if args.json:
            _emit(stats)
        else:
            terminal.show(render.stats_grid(stats) if stats else None, render.stats_table(stats))
        _warn_eviction(client)
        return 0
    try:
        interval = parse_duration(args.interval, where="--interval")
    except UnitError as exc:
        raise UsageError(str(exc)) from None
    if interval <= 0:
        raise UsageError(f"--interval: must be more than 0, got {args.interval!r}")
    stats = _stats(client, args.queue)  # an unreachable Redis fails here, once, exit 1
    error = None
    live = terminal.Live() if not args.json and terminal.interactive() else None
    try:
        with live or contextlib.nullcontext():
            while True:
                head = f"forq stats   {time.strftime('%Y-%m-%d %H:%M:%S')}   every " \
                       f"{render.age(interval)}   (Ctrl-C to stop)"
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
                else:  # not a terminal: plain frames, each after a clear-screen code
                    sys.stdout.write(f"{CLEAR}{head}\n\n{render.stats_table(stats)}\n")
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


# -- dead ----------------------------------------------------------------------------


def _dead_row(job: Job) -> dict[str, Any]:
    return {"id": job.id, "task": job.task, "reason": job.reason, "died_at": render.died_at(job),
            "attempts": job.attempts, "crashes": job.crashes}


def cmd_dead_list(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise UsageError(f"--limit: must be at least 1, got {args.limit}")
    queue = _queue(args.queue, _client(args))
    jobs = queue.dead(limit=args.limit)
    total = queue.redis.zcard(queue.keys.dead)
    if args.json:
        _emit({"queue": queue.name, "total": total, "jobs": [_dead_row(j) for j in jobs]})
        return 0
    if not jobs:
        print(f"no dead jobs in queue {queue.name}")
        return 0
    terminal.show(render.dead_grid(jobs), render.dead_table(jobs))
    shown = f"{len(jobs)} of {total}" if total > len(jobs) else f"{total}"
    print(f"\n{shown} dead in queue {queue.name} (oldest first; forq dead show -q {queue.name} ID)")
    return 0


def cmd_dead_show(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.queue:
        job = _queue(args.queue, client).get(args.id)
    else:
        job = find_job(client, args.id)
    if job.state != "dead":
        raise Failure(f"job {job.id} in queue {job.queue} is {job.state}, not dead "
                      f"(forq job {job.id} shows it)")
    if args.json:
        _emit(dict(job.to_dict(), died_at=render.died_at(job)))
    else:
        print(render.job(job))
    return 0


def _dead_action(args: argparse.Namespace, verb: str) -> int:
    if args.all and args.ids:
        raise UsageError("give job ids or --all, not both")
    if not args.all and not args.ids:
        raise UsageError(f"say which dead jobs to {verb}: give job ids, or --all for every one")
    queue = _queue(args.queue, _client(args))
    action = queue.requeue_dead if verb == "requeue" else queue.purge_dead
    not_dead: list[str] = []
    if args.ids:
        ids = list(dict.fromkeys(args.ids))
        count, not_dead = action(ids)
    else:
        # In batches, and never more rounds than the dead set had at the start: a
        # requeued job that dies again at once is not chased forever.
        batch = 10000
        total = queue.redis.zcard(queue.keys.dead)
        count = 0
        with terminal.progress(total, f"{verb} dead jobs of {queue.name}") as advance:
            for _ in range(total // batch + 1):
                n, _missing = action(None, limit=batch)
                count += n
                advance(n)
                if n < batch:
                    break
    done = "requeued" if verb == "requeue" else "purged"
    if args.json:
        _emit({"queue": queue.name, done: count, "not_dead": not_dead})
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


# -- workers, schedules ----------------------------------------------------------------


def cmd_workers(args: argparse.Namespace) -> int:
    from forq.supervisor.roster import live_supervisors

    records = live_supervisors(_client(args))
    if args.json:
        _emit(records)
    else:
        terminal.show(render.workers_grid(records) if records else None,
                      render.workers_table(records))
    return 0


def cmd_schedules(args: argparse.Namespace) -> int:
    from forq.supervisor.scheduler import schedule_rows

    client = _client(args)
    schedules = _config(args).schedules if args.config else None
    now = _redis_now(client)
    rows = schedule_rows(client, now, schedules)
    if args.json:
        _emit(rows)
    else:
        terminal.show(render.schedules_grid(rows, now) if rows else None,
                      render.schedules_table(rows, now, from_config=args.config is not None))
    return 0


# -- cancel, limit ----------------------------------------------------------------------


def cmd_cancel(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.queue:
        queue = _queue(args.queue, client)
    else:
        queue = _queue(find_job(client, args.id).queue, client)
    outcome = queue.cancel(args.id)
    if outcome == "missing":
        raise JobNotFound(f"no job {args.id} in queue {queue.name}")
    state = "active" if outcome == "cancelling" else outcome
    if args.json:
        _emit({"id": args.id, "queue": queue.name, "outcome": outcome, "state": state})
    elif outcome == "cancelled":
        print(f"cancelled job {args.id} (queue {queue.name})")
    elif outcome == "cancelling":
        print(f"cancelling job {args.id} (queue {queue.name}): it is running; its supervisor "
              "will stop it within one lease extension")
    else:
        print(f"job {args.id} (queue {queue.name}) already {outcome}: nothing to cancel")
    return 0


def _limits_info(queue: Queue) -> dict[str, Any]:
    current = queue.limits()
    per_ms = current.get("rate")
    per_second = per_ms * 1000.0 if per_ms else None
    mif = current.get("max_in_flight")
    return {
        "queue": queue.name,
        "rate": render.rate(per_second) if per_second else None,
        "rate_per_second": per_second,
        "burst": current.get("burst") if per_second else None,
        "max_in_flight": int(mif) if mif else None,
    }


def cmd_limit(args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {}
    if args.rate is not None:
        if args.rate.strip().lower() == "none":
            changes["rate"] = None
        else:
            try:
                changes["rate"] = parse_rate(args.rate, where="--rate")
            except UnitError as exc:
                raise UsageError(str(exc)) from None
    if args.max_in_flight is not None:
        text = args.max_in_flight.strip().lower()
        if text == "none":
            changes["max_in_flight"] = None
        else:
            try:
                value = int(text)
            except ValueError:
                value = 0
            if value < 1:
                raise UsageError(f'--max-in-flight: expected an integer >= 1 or "none", '
                                 f"got {args.max_in_flight!r}")
            changes["max_in_flight"] = value
    queue = _queue(args.queue, _client(args))
    if changes:
        queue.set_limits(**changes)
    info = _limits_info(queue)
    if args.json:
        _emit(info)
    else:
        print(render.limits(info))
    return 0


def cmd_web(args: argparse.Namespace) -> int:
    try:
        from forq.web.security import Auth, SecretError
        from forq.web.server import parse_listen, serve
    except ImportError as exc:
        raise Failure(f"forq web needs the web extra ({exc.name} is missing): "
                      "pip install 'forq[web]'") from None
    try:
        parse_listen(args.listen)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        refresh = parse_duration(args.refresh, where="--refresh")
    except UnitError as exc:
        raise UsageError(str(exc)) from None
    if refresh <= 0:
        raise UsageError(f"--refresh: must be more than 0, got {args.refresh!r}")
    try:
        auth = Auth.from_sources(args.token_file, args.basic_auth_file)
    except SecretError as exc:
        raise UsageError(str(exc)) from None
    client = _client(args)
    client.ping()  # an unreachable Redis is one line now, not an error page later
    return serve(client, args.listen, read_only=args.read_only, auth=auth,
                 refresh=refresh)


def cmd_config_check(args: argparse.Namespace) -> int:
    from forq.supervisor.config import check_config_main

    return check_config_main(args.path)


# -- the parser -----------------------------------------------------------------------


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("forq")
    except Exception:  # noqa: BLE001 — not installed: the source tree's version
        from forq.supervisor.roster import VERSION

        return VERSION


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="forq", description="A reliable task queue on Redis.",
                    epilog="Redis: --redis URL, else $FORQ_REDIS_URL, else the URL in --config, "
                           "else redis://127.0.0.1:6379/0.")
    parser.add_argument("--redis", metavar="URL",
                        help="Redis URL (default: $FORQ_REDIS_URL or redis://127.0.0.1:6379/0)")
    parser.add_argument("--version", action="version", version=f"forq {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # Options every Redis command takes, also after the command name. SUPPRESS keeps a
    # subcommand from overwriting the global --redis with None.
    common = Parser(add_help=False)
    common.add_argument("--redis", metavar="URL", default=argparse.SUPPRESS,
                        help="Redis URL (overrides $FORQ_REDIS_URL)")
    inspect = Parser(add_help=False, parents=[common])
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    with_config = Parser(add_help=False)
    with_config.add_argument("--config", "-c", metavar="PATH",
                             help="take the Redis URL from this supervisor config")

    p = sub.add_parser("run", help="run a supervisor", parents=[common])
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, help="TOML config file")
    p.add_argument("--log-format", choices=("text", "json"), help="override the config's")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("enqueue", help="enqueue a job; prints its id",
                       parents=[common, with_config])
    p.add_argument("task")
    p.add_argument("--args", help="JSON array of positional arguments")
    p.add_argument("--kwargs", help="JSON object of keyword arguments")
    p.add_argument("-q", "--queue", default="default")
    p.add_argument("--priority", type=int, default=0, help="higher runs first")
    p.add_argument("--delay", help='run after this long, e.g. "30s"')
    p.add_argument("--key", help="idempotency key: no second live job with this key")
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("stats", help="counts per queue", parents=[inspect, with_config])
    p.add_argument("-q", "--queue", help="only this queue")
    p.add_argument("--watch", "-w", action="store_true", help="refresh in place until Ctrl-C")
    p.add_argument("--interval", "-n", default="2s", help="refresh period for --watch (2s)")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("job", help="show a job's record and history",
                       parents=[inspect, with_config])
    p.add_argument("id")
    p.set_defaults(func=cmd_job)

    p = sub.add_parser("dead", help="the dead-letter set: list, show, requeue, purge")
    dsub = p.add_subparsers(dest="dead_command", required=True, metavar="list|show|requeue|purge")
    d = dsub.add_parser("list", help="dead jobs, oldest first", parents=[inspect, with_config])
    d.add_argument("-q", "--queue", required=True)
    d.add_argument("--limit", type=int, default=100, help="show at most this many (100)")
    d.set_defaults(func=cmd_dead_list)
    d = dsub.add_parser("show", help="one dead job in full", parents=[inspect, with_config])
    d.add_argument("-q", "--queue", help="its queue (default: search every queue)")
    d.add_argument("id")
    d.set_defaults(func=cmd_dead_show)
    for name, func, what in (("requeue", cmd_dead_requeue, "back to pending, counts reset"),
                             ("purge", cmd_dead_purge, "delete for good")):
        d = dsub.add_parser(name, help=f"dead jobs {what}", parents=[inspect, with_config])
        d.add_argument("-q", "--queue", required=True)
        d.add_argument("ids", nargs="*", metavar="ID")
        d.add_argument("--all", action="store_true", help="every dead job of the queue")
        d.set_defaults(func=func)

    p = sub.add_parser("workers", help="live supervisors", parents=[inspect, with_config])
    p.set_defaults(func=cmd_workers)

    p = sub.add_parser("schedules", help="cron schedules: last and next fire",
                       parents=[inspect])
    p.add_argument("--config", "-c", metavar="PATH",
                   help="the schedules of this config (default: those the running "
                        "supervisors published in Redis)")
    p.set_defaults(func=cmd_schedules)

    p = sub.add_parser("cancel", help="cancel a job (an active one is stopped by its supervisor)",
                       parents=[inspect, with_config])
    p.add_argument("id")
    p.add_argument("-q", "--queue", help="its queue (default: search every queue)")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("limit", help="show or set a queue's global rate and max_in_flight",
                       parents=[inspect, with_config],
                       description="Limits apply across every supervisor at its next claim. "
                                   "A supervisor whose config sets a limit for the queue sets "
                                   "it again when it starts or reloads.")
    p.add_argument("queue")
    p.add_argument("--rate", metavar="RATE", help='e.g. "50/s", "100/m", "3/h", or "none"')
    p.add_argument("--max-in-flight", metavar="N", help='an integer >= 1, or "none"')
    p.set_defaults(func=cmd_limit)

    p = sub.add_parser("web", help="the live dashboard (needs pip install 'forq[web]')",
                       parents=[common, with_config],
                       description="Serve the operator dashboard. Auth (off by default): "
                                   "$FORQ_WEB_TOKEN or --token-file (a browser signs in at "
                                   "/?token=...), $FORQ_WEB_BASIC_AUTH or --basic-auth-file "
                                   "(user:password).")
    p.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="where to serve (127.0.0.1:8080)")
    p.add_argument("--read-only", action="store_true",
                   help="no actions: hide every button and refuse every POST")
    p.add_argument("--token-file", metavar="PATH", help="file holding the access token")
    p.add_argument("--basic-auth-file", metavar="PATH", help='file holding "user:password"')
    p.add_argument("--refresh", default="1s", help="live views update this often (1s)")
    p.set_defaults(func=cmd_web)

    p = sub.add_parser("config", help="configuration tools")
    csub = p.add_subparsers(dest="config_command", required=True, metavar="check")
    c = csub.add_parser("check", help="validate a config file without starting")
    c.add_argument("path")
    c.set_defaults(func=cmd_config_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        return _fail(str(exc), 2)
    except (Failure, ForqError) as exc:
        return _fail(str(exc), 1)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        return _fail(f"cannot reach Redis: {exc}", 1)
    except redis.RedisError as exc:
        return _fail(f"Redis error: {exc}", 1)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `forq dead list | head`: the reader left; say nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # noqa: BLE001 — the promise is "never a traceback"
        if os.environ.get("FORQ_DEBUG"):
            raise
        return _fail(f"unexpected error ({type(exc).__name__}): {exc} "
                     "(set FORQ_DEBUG=1 for the traceback)", 1)


def _fail(message: str, code: int) -> int:
    print(f"forq: {' '.join(message.split())}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
