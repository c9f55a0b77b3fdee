"""forq limit, pause, resume, throttle, web, config check: changing a queue's limits,
pausing or throttling it, the dashboard, the config."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from forq import Queue, units
from forq.supervisor.cli import render, terminal
from forq.supervisor.cli.base import (
    Failure,
    Parents,
    UsageError,
    duration_arg,
    emit,
    queue_named,
    redis_for,
)
from forq.units import UnitError, parse_rate


def _limits_info(queue: Queue) -> dict[str, Any]:
    current = queue.limits()
    per_ms = current.get("rate")
    per_second = per_ms * 1000.0 if per_ms else None
    mif = current.get("max_in_flight")
    group_per_ms = current.get("group_rate")
    group_per_second = group_per_ms * 1000.0 if group_per_ms else None
    return {
        "queue": queue.name,
        "rate": units.rate(per_second) if per_second else None,
        "rate_per_second": per_second,
        "burst": current.get("burst") if per_second else None,
        "max_in_flight": int(mif) if mif else None,
        # per group (jobs enqueued with group=): 1 when unset
        "group_concurrency": int(current.get("group_concurrency") or 1),
        "group_rate": units.rate(group_per_second) if group_per_second else None,
        "group_rate_per_second": group_per_second,
    }


def _positive_or_none(text: str, option: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f'{option}: expected an integer >= 1 or "none", got {text!r}')
    return value


def _rate_or_none(text: str, option: str) -> tuple[float, float] | None:
    if text.strip().lower() == "none":
        return None
    try:
        return parse_rate(text, where=option)
    except UnitError as exc:
        raise UsageError(str(exc)) from None


def cmd_limit(args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {}
    if args.rate is not None:
        changes["rate"] = _rate_or_none(args.rate, "--rate")
    if args.max_in_flight is not None:
        changes["max_in_flight"] = _positive_or_none(args.max_in_flight, "--max-in-flight")
    if args.group_concurrency is not None:
        changes["group_concurrency"] = _positive_or_none(args.group_concurrency,
                                                         "--group-concurrency")
    if args.group_rate is not None:
        changes["group_rate"] = _rate_or_none(args.group_rate, "--group-rate")
    queue = queue_named(args.queue, redis_for(args))
    if changes:
        queue.set_limits(**changes)
    info = _limits_info(queue)
    if args.json:
        emit(info)
    else:
        print(render.limits(info))
    return 0


def _set_paused(args: argparse.Namespace, paused: bool) -> int:
    queue = queue_named(args.queue, redis_for(args))
    changed = queue.pause() if paused else queue.resume()
    if args.json:
        emit({"queue": queue.name, "paused": paused, "changed": changed})
    elif paused:
        print(f"paused queue {queue.name}: no supervisor claims from it; running jobs go on"
              if changed else f"queue {queue.name} was paused already")
    else:
        print(f"resumed queue {queue.name}: supervisors claim from it again"
              if changed else f"queue {queue.name} was not paused")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    """lua/pause.lua: every supervisor's next claim leases nothing from the queue."""
    return _set_paused(args, True)


def cmd_resume(args: argparse.Namespace) -> int:
    """lua/resume.lua: claims again, the supervisors woken over the wake channel; with
    --task, lua/resume_task.lua: the task its circuit breaker tripped, jobs put back."""
    if not args.task:
        return _set_paused(args, False)
    queue = queue_named(args.queue, redis_for(args))
    changed = queue.resume(task=args.task)
    if args.json:
        emit({"queue": queue.name, "task": args.task, "tripped": False, "changed": changed})
    else:
        print(f"resumed task {args.task} of queue {queue.name}: its parked jobs are pending "
              "again" if changed else f"task {args.task} of queue {queue.name} was not tripped")
    return 0


def cmd_throttle(args: argparse.Namespace) -> int:
    """lua/set_throttle.lua: the queue (or a group) throttled for a while, as a handler's
    `current().throttle` does; --off lifts it; neither shows it."""
    queue = queue_named(args.queue, redis_for(args))
    scope = f"group {args.group!r} of queue {queue.name}" if args.group else f"queue {queue.name}"
    if args.off and args.duration:
        raise UsageError("give a duration or --off, not both")
    changed = None
    if args.off:
        changed = queue.unthrottle(group=args.group)
    elif args.duration:
        try:
            queue.throttle(args.duration, group=args.group)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    left = queue.throttled(group=args.group)
    if args.json:
        emit({"queue": queue.name, "group": args.group, "throttled_for": left,
              **({"lifted": changed} if changed is not None else {})})
    elif args.off:
        print(f"lifted the throttle of {scope}" if changed else f"{scope} was not throttled")
    elif left is None:
        print(f"{scope} is not throttled")
    else:
        print(f"{scope} is throttled for {units.age(left)}: no job of it starts before then")
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
    refresh = duration_arg(args.refresh, "--refresh", positive=True)
    try:
        auth = Auth.from_sources(args.token_file, args.basic_auth_file)
    except SecretError as exc:
        raise UsageError(str(exc)) from None
    client = redis_for(args)
    client.ping()  # an unreachable Redis is one line now, not an error page later
    return serve(client, args.listen, read_only=args.read_only, auth=auth,
                 refresh=refresh, colors=terminal.interactive(sys.stderr))


def cmd_config_check(args: argparse.Namespace) -> int:
    from forq.supervisor.config.load import check_config_main

    return check_config_main(args.path)


def register(sub: Any, parents: Parents) -> None:
    p = sub.add_parser("limit", help="show or set a queue's global rate and max_in_flight",
                       parents=[parents.inspect, parents.with_config],
                       description="Limits apply across every supervisor at its next claim. "
                                   "A supervisor whose config sets a limit for the queue sets "
                                   "it again when it starts or reloads.")
    p.add_argument("queue")
    p.add_argument("--rate", metavar="RATE", help='e.g. "50/s", "100/m", "3/h", or "none"')
    p.add_argument("--max-in-flight", metavar="N", help='an integer >= 1, or "none"')
    p.add_argument("--group-concurrency", metavar="N",
                   help='running jobs per group: an integer >= 1, or "none" (back to 1)')
    p.add_argument("--group-rate", metavar="RATE",
                   help='jobs started per group, e.g. "5/s", or "none"')
    p.set_defaults(func=cmd_limit)

    p = sub.add_parser("pause", help="stop every supervisor claiming from a queue",
                       parents=[parents.inspect, parents.with_config],
                       description="No supervisor claims from the queue until `forq resume`; "
                                   "running jobs finish and keep their leases, enqueues wait "
                                   "in pending.")
    p.add_argument("queue")
    p.set_defaults(func=cmd_pause)
    p = sub.add_parser("resume", help="let supervisors claim from a paused queue again",
                       parents=[parents.inspect, parents.with_config],
                       description="With --task: resume a task its circuit breaker tripped "
                                   "(see `forq stats`), its parked jobs pending again at "
                                   "their places.")
    p.add_argument("queue")
    p.add_argument("--task", metavar="TASK", help="the tripped task to resume")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("throttle", help="show, set or lift a queue's (or a group's) throttle",
                       parents=[parents.inspect, parents.with_config],
                       description="A throttled queue (or group) starts no job on any "
                                   "supervisor until the throttle ends; handlers set one with "
                                   "current().throttle(\"60s\"). A longer throttle in force "
                                   "stays; --off lifts it.")
    p.add_argument("queue")
    p.add_argument("duration", nargs="?", help='how long, e.g. "60s" (up to "24h")')
    p.add_argument("--group", metavar="GROUP", help="only this group of the queue")
    p.add_argument("--off", action="store_true", help="lift the throttle in force")
    p.set_defaults(func=cmd_throttle)

    p = sub.add_parser("web", help="the live dashboard (needs pip install 'forq[web]')",
                       parents=[parents.common, parents.with_config],
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
