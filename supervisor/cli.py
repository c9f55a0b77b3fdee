"""The `forq` command: run a supervisor, enqueue, and look at what is going on.

Every error is one line on stderr and a non-zero exit, never a traceback:
2 for a usage or config mistake, 1 for a runtime failure (Redis unreachable,
unknown job id).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import redis

from jobs import ForqError, Queue, find_job, known_queues
from jobs.connection import connect
from jobs.units import UnitError, parse_duration

from . import render


class UsageError(Exception):
    """A mistake in the command line: exit code 2."""


def _client(args: argparse.Namespace) -> redis.Redis:
    url = args.redis
    if url is None and getattr(args, "config", None):
        from .config import load_config

        url = load_config(args.config).redis_url
    return connect(url)


def _json_arg(text: str | None, what: str, kind: type) -> Any:
    if text is None:
        return kind()
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--{what} is not valid JSON: {exc}") from None
    if not isinstance(value, kind):
        raise UsageError(f"--{what} must be a JSON {'array' if kind is list else 'object'}")
    return value


def cmd_run(args: argparse.Namespace) -> int:
    from .supervisor import run_supervisor

    return run_supervisor(args.config, log_format=args.log_format)


def cmd_enqueue(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {
        "args": _json_arg(args.args, "args", list),
        "kwargs": _json_arg(args.kwargs, "kwargs", dict),
        "priority": args.priority,
    }
    if args.delay:
        try:
            parse_duration(args.delay)
        except UnitError as exc:
            raise UsageError(f"--delay: {exc}") from None
        options["delay"] = args.delay
    if args.key:
        options["key"] = args.key
    job = Queue(args.queue, redis=_client(args)).enqueue(args.task, **options)
    print(job.id)
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    job = find_job(_client(args), args.id)
    if args.json:
        print(json.dumps(job.to_dict(), indent=2, default=str))
    else:
        print(render.job(job))
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    client = _client(args)
    names = [args.queue] if args.queue else known_queues(client)
    stats = {name: Queue(name, redis=client).stats() for name in names}
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        print(render.stats_table(stats))
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    from .config import check_config_main

    return check_config_main(args.path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forq", description="A reliable task queue on Redis.")
    parser.add_argument("--redis", metavar="URL",
                        help="Redis URL (default: $FORQ_REDIS_URL or redis://127.0.0.1:6379/0)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run a supervisor")
    p.add_argument("--config", "-c", default="/etc/forq/forq.toml", help="TOML config file")
    p.add_argument("--log-format", choices=("text", "json"), help="override the config's")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("enqueue", help="enqueue a job; prints its id")
    p.add_argument("task")
    p.add_argument("--args", help="JSON array of positional arguments")
    p.add_argument("--kwargs", help="JSON object of keyword arguments")
    p.add_argument("-q", "--queue", default="default")
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--delay", help='run after this long, e.g. "30s"')
    p.add_argument("--key", help="idempotency key")
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("job", help="show a job's record and history")
    p.add_argument("id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_job)

    p = sub.add_parser("stats", help="counts per queue")
    p.add_argument("-q", "--queue")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("config", help="configuration tools")
    csub = p.add_subparsers(dest="config_command", required=True, metavar="check")
    c = csub.add_parser("check", help="validate a config file without starting")
    c.add_argument("path")
    c.set_defaults(func=cmd_config_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"forq: {exc}", file=sys.stderr)
        return 2
    except ForqError as exc:
        print(f"forq: {exc}", file=sys.stderr)
        return 1
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        print(f"forq: cannot reach Redis: {exc}", file=sys.stderr)
        return 1
    except redis.RedisError as exc:
        print(f"forq: Redis error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
