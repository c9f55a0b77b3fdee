"""forq schedule add | remove | pause | resume | trigger | list: schedules at run time,
stored in Redis beside the config files' (issue 29 item 7; `forq.schedules`).

Every supervisor picks a change up within about a second. A config file's schedule is
its file's: remove, pause and resume refuse it (trigger and list work on both).
"""

from __future__ import annotations

import argparse
from typing import Any

from forq.schedules import CATCH_UP, OVERLAP, ScheduleError, Schedules, definition
from forq.supervisor.cli import render, terminal
from forq.supervisor.cli.base import Parents, UsageError, emit, json_arg, redis_for, redis_now


def cmd_add(args: argparse.Namespace) -> int:
    try:
        found = definition(args.name, args.cron, queue=args.queue, task=args.task,
                           args=json_arg(args.args, "args", list),
                           kwargs=json_arg(args.kwargs, "kwargs", dict),
                           timezone=args.timezone, catch_up=args.catch_up,
                           max_catch_up=args.max_catch_up, overlap=args.overlap)
    except ScheduleError as exc:  # a bad definition: the command line's mistake
        raise UsageError(str(exc)) from None
    schedules = Schedules(redis_for(args))
    outcome = schedules.add(found.pop("name"), found.pop("cron"), replace=args.replace, **found)
    if args.json:
        emit({"name": args.name, "outcome": outcome})
    else:
        print(f"{outcome} schedule {args.name}: {args.cron} ({args.timezone}) -> {args.task} "
              f"on {args.queue}; every supervisor runs it within a second")
    return 0


def _change(args: argparse.Namespace, verb: str) -> int:
    schedules = Schedules(redis_for(args))
    if verb == "remove":
        schedules.remove(args.name)
        changed, said = True, f"removed schedule {args.name}"
    elif verb == "pause":
        changed = schedules.pause(args.name)
        said = (f"paused schedule {args.name}: no ticks until resumed" if changed
                else f"schedule {args.name} was paused already")
    else:
        changed = schedules.resume(args.name)
        said = (f"resumed schedule {args.name}: it ticks from now on (the ticks it missed "
                "are not caught up)" if changed else f"schedule {args.name} was not paused")
    if args.json:
        emit({"name": args.name, "action": verb, "changed": changed})
    else:
        print(said)
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    return _change(args, "remove")


def cmd_pause(args: argparse.Namespace) -> int:
    return _change(args, "pause")


def cmd_resume(args: argparse.Namespace) -> int:
    return _change(args, "resume")


def cmd_trigger(args: argparse.Namespace) -> int:
    done = Schedules(redis_for(args)).trigger(args.name, force=args.force)
    if args.json:
        emit(done.__dict__)
    elif done.job_id:
        print(f"triggered schedule {args.name}: job {done.job_id}")
    else:
        print(f"schedule {args.name} not triggered: its last run, job {done.skipped_for}, is "
              f"still {done.skipped_state} (overlap = \"skip\"; --force runs it anyway)")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    client = redis_for(args)
    now = redis_now(client)
    rows = Schedules(client).list()
    if args.json:
        emit(rows)
    else:
        terminal.show(render.schedules_grid(rows, now) if rows else None,
                      render.schedules_table(rows, now, from_config=False))
    return 0


def register(sub: Any, parents: Parents) -> None:
    common = [parents.inspect, parents.with_config]
    p = sub.add_parser("schedule", help="add, remove, pause, resume, trigger or list schedules "
                                        "at run time")
    ssub = p.add_subparsers(dest="schedule_command", required=True,
                            metavar="add|remove|pause|resume|trigger|list")
    s = ssub.add_parser("add", help="add a schedule every supervisor runs (stored in Redis)",
                        parents=common)
    s.add_argument("name")
    s.add_argument("--cron", required=True,
                   help='5-field cron ("0 3 * * *"), a macro (@daily) or "@every 30s"')
    s.add_argument("--queue", "-q", required=True, help="the queue each tick's job goes to")
    s.add_argument("--task", required=True, help="the task each tick's job runs")
    s.add_argument("--args", help="JSON array of positional arguments")
    s.add_argument("--kwargs", help="JSON object of keyword arguments")
    s.add_argument("--timezone", default="UTC", help="IANA time zone of the cron fields (UTC)")
    s.add_argument("--catch-up", choices=CATCH_UP, default="latest",
                   help="after downtime: skip missed ticks, run the latest, or each (latest)")
    s.add_argument("--max-catch-up", type=int, default=100, help="for all: at most this many")
    s.add_argument("--overlap", choices=OVERLAP, default="allow",
                   help="skip: no tick while the last tick's job is live (allow)")
    s.add_argument("--replace", action="store_true", help="overwrite one of the same name")
    s.set_defaults(func=cmd_add)
    for name, func, what in (
            ("remove", cmd_remove, "remove a run-time schedule"),
            ("pause", cmd_pause, "no ticks of a run-time schedule until resumed"),
            ("resume", cmd_resume, "tick again (missed ticks are not caught up)"),
            ("trigger", cmd_trigger, "run one tick now, once (config schedules too)")):
        s = ssub.add_parser(name, help=what, parents=common)
        s.add_argument("name")
        if name == "trigger":
            s.add_argument("--force", action="store_true",
                           help='run even when overlap = "skip" and the last run is live')
        s.set_defaults(func=func)
    s = ssub.add_parser("list", help="every schedule: run-time and published by supervisors",
                        parents=common)
    s.set_defaults(func=cmd_list)
