"""The `forq` command: run a supervisor, enqueue, and look at what is going on.

    forq run [--config PATH]
    forq enqueue TASK [--args JSON] [--kwargs JSON] [-q QUEUE] [--priority N] [--delay 30s] [--key KEY]
        [--max-attempts N] [--timeout 30s] [--depends-on ID] [--lifo] [...every option of Queue.enqueue] [--json]
    forq enqueue --jobs FILE|- [-q QUEUE] [--batch [--on-success TASK] [--on-complete TASK]] [--json]
    forq stats [-q QUEUE] [--json] [--watch [--interval 2s]]
    forq job ID [--json]
    forq events QUEUE [--follow [--timeout 1m]] [--last N | --since ID | --all] [--job ID] [--event KIND] [--json]
    forq events QUEUE [--enable [--keep N] | --disable] [--on-dead TASK|none]
    forq dead list|show|requeue|purge -q QUEUE [ID...|--all] [--json]
    forq supervisors [--json]     (alias: forq workers)
    forq schedules [--config PATH] [--json]
    forq schedule add NAME --cron C --queue Q --task T [--overlap skip] | remove|pause|resume|trigger NAME | list
    forq web [--config PATH] [--listen 127.0.0.1:8080] [--read-only]
    forq cancel ID [-q QUEUE] [--json]
    forq promote ID | priority ID N | reschedule ID --at TIME|--in 30m [-q QUEUE] [--json]
    forq jobs QUEUE [--state dead] [--task T] [--error REGEX] [--since 1h] [--args-contains S]
              [--requeue|--cancel|--purge|--promote [--yes]] [--json]
    forq limit QUEUE [--rate 50/s|none] [--max-in-flight N|none] [--json]
    forq pause|resume QUEUE [--json]   forq resume QUEUE --task T (a tripped task)
    forq config check PATH
    forq usage QUEUE [--group G] [--since 1d] [--json]
    forq top [-q QUEUE] [--once] [--interval 2s] [--json]

Redis: ``--redis URL`` (before or after the command), else ``$FORQ_REDIS_URL``,
else the URL of the config given with ``--config``, else redis://127.0.0.1:6379/0.

Every error is one line on stderr and a non-zero exit, never a traceback:
2 for a usage or config mistake (bad flag, bad JSON, bad duration or rate),
1 for a runtime failure (Redis unreachable, unknown job id, some of the given
ids were not dead). ``FORQ_DEBUG=1`` shows the traceback of an unexpected error.

The commands themselves live in `forq.supervisor.cli`, one module per family.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

import redis

from forq import ForqError
from forq.supervisor.cli import FAMILIES
from forq.supervisor.cli.base import Failure, Parents, Parser, UsageError


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("forq")
    except Exception:  # noqa: BLE001 — not installed: the source tree's version
        from forq.supervisor.redis_io.roster import VERSION

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
    parents = Parents(common=common, inspect=inspect, with_config=with_config)
    for family in FAMILIES:
        importlib.import_module(f"forq.supervisor.cli.{family}").register(sub, parents)
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
