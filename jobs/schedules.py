"""Schedules at run time: add, remove, pause, resume and trigger cron schedules in Redis,
beside the ``[[schedule]]`` entries of the supervisors' config files.

    from forq.schedules import Schedules
    schedules = Schedules(redis_client)
    schedules.add("nightly-report", "0 3 * * *", queue="reports", task="reports.build",
                  timezone="Europe/Paris", overlap="skip")
    schedules.pause("nightly-report"); schedules.resume("nightly-report")
    schedules.trigger("nightly-report")          # one tick now, once
    schedules.list()                             # every schedule, config and run-time

A run-time schedule is stored as the table a config file would hold (the same keys,
checked the same way) in the ``forq:schedules:runtime`` hash, written by
`lua/schedule_define.lua`. Every supervisor runs every run-time schedule, as it runs its
config's: it checks the hash's version once a second (`RELOAD_SECONDS`) and reloads it
when it changed, so an added, removed, paused or resumed schedule takes effect within
about a second. Each tick is still enqueued exactly once across supervisors (its
idempotency key). A schedule in a config file stays owned by that file: adding a
run-time schedule of the same name, or removing, pausing or resuming it here, is
refused (trigger and list work on both).

``overlap = "skip"`` skips a tick while the job of the last tick (or of the last
trigger) is pending, scheduled, waiting or running; ``"allow"`` (the default, as before
this option existed) enqueues every tick.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from forq.errors import ForqError
from forq.payload import MAX_NAME, build_spec
from forq.store import cron, plans
from forq.store.keys import SCHEDULE_DEFS, SCHEDULES, SCHEDULES_RUNTIME, QueueKeys
from forq.store.plans import Plan

RELOAD_SECONDS = 1.0  # how often a supervisor looks for changed run-time schedules
MAX_SCHEDULES = 1000  # run-time schedules in one Redis
MAX_DEFINITION_BYTES = 64 * 1024  # one schedule's definition (its args and kwargs mostly)
MAX_CATCH_UP = 1000
STALE_AFTER = 600.0  # a config's schedule no supervisor re-published for this long is stale
FORGET_AFTER = 7 * 86400.0  # ... and after this long it is dropped
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]*")  # a config's names
QUEUE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
CATCH_UP = ("none", "latest", "all")
OVERLAP = ("allow", "skip")
LIVE = ("pending", "scheduled", "waiting", "active")  # a job overlap="skip" waits for
KEYS = ("name", "cron", "queue", "task", "timezone", "args", "kwargs", "catch_up",
        "max_catch_up", "overlap")  # a definition's, as a config's [[schedule]] table


class ScheduleError(ForqError):
    """A schedule cannot be added or changed as asked (a bad definition, a name a config
    file owns, one that exists already): the message says which and why."""


class ScheduleNotFound(ScheduleError, LookupError):
    """No schedule of that name, at run time or in a published config."""


def definition(name: str, cron_expression: str, *, queue: str, task: str,
               args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
               timezone: str = "UTC", catch_up: str = "latest", max_catch_up: int = 100,
               overlap: str = "allow") -> dict[str, Any]:
    """A run-time schedule's definition, checked as a config's ``[[schedule]]`` table is
    (`ScheduleError` naming the key); the arguments are those of `Schedules.add`."""
    where = f"schedule {name!r}"
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or len(name) > MAX_NAME:
        raise ScheduleError(f"schedule name must be letters, digits, '_', '.', ':' or '-' "
                            f"(at most {MAX_NAME}), got {name!r}"[:300])
    if not isinstance(queue, str) or not QUEUE_RE.fullmatch(queue) or len(queue) > MAX_NAME:
        raise ScheduleError(f"{where}: queue must be a queue name, got {queue!r}"[:300])
    if not isinstance(task, str) or not 0 < len(task) <= MAX_NAME:
        raise ScheduleError(f"{where}: task must be a task name, got {task!r}"[:300])
    if not isinstance(cron_expression, str):
        raise ScheduleError(f"{where}: cron must be a string, got {cron_expression!r}"[:300])
    if not isinstance(timezone, str):
        raise ScheduleError(f"{where}: timezone must be a string, got {timezone!r}"[:300])
    try:
        cron.zone(timezone)
        cron.every_of(cron_expression, timezone)
    except cron.CronError as exc:
        raise ScheduleError(f"{where}: {exc}"[:300]) from None
    if catch_up not in CATCH_UP:
        raise ScheduleError(f"{where}: catch_up must be one of {', '.join(CATCH_UP)}, "
                            f"got {catch_up!r}"[:300])
    if overlap not in OVERLAP:
        raise ScheduleError(f"{where}: overlap must be one of {', '.join(OVERLAP)}, "
                            f"got {overlap!r}"[:300])
    if not isinstance(max_catch_up, int) or isinstance(max_catch_up, bool) \
            or not 1 <= max_catch_up <= MAX_CATCH_UP:
        raise ScheduleError(f"{where}: max_catch_up must be an integer from 1 to "
                            f"{MAX_CATCH_UP}, got {max_catch_up!r}"[:300])
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs or {}, Mapping):
        raise ScheduleError(f"{where}: args must be a list and kwargs a mapping")
    found = {"name": name, "cron": cron_expression, "queue": queue, "task": task,
             "timezone": timezone, "args": list(args), "kwargs": dict(kwargs or {}),
             "catch_up": catch_up, "max_catch_up": max_catch_up, "overlap": overlap}
    try:
        build_spec(task, {"args": found["args"], "kwargs": found["kwargs"]},
                   max_payload_bytes=MAX_DEFINITION_BYTES)
    except ValueError as exc:
        raise ScheduleError(f"{where}: {exc}"[:300]) from None
    return found


@dataclass
class Triggered:
    """What `trigger` did: the job it enqueued, or (overlap = "skip") the live job of
    the last run that it waited for, and that job's state."""

    name: str
    job_id: str | None
    skipped_for: str | None = None
    skipped_state: str | None = None


def _load(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _record(raw: str | None) -> tuple[float | None, str | None, float | None]:
    """A schedule's record (lua/schedule_fired.lua): last tick, last job, last skip."""
    value = _load(raw)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), None, None  # an older forq's: the last tick alone
    if not isinstance(value, dict):
        return None, None, None
    job = value.get("job")
    return (_number(value.get("last")), str(job) if isinstance(job, str) else None,
            _number(value.get("skipped")))


def _config_owned(published: Any, now: float) -> bool:
    """Whether a published definition is a config file's, and recent enough to count."""
    seen = _number(published.get("seen")) if isinstance(published, dict) else None
    return (isinstance(published, dict) and published.get("source", "config") == "config"
            and seen is not None and now - seen <= FORGET_AFTER)


def _now(reply: Sequence[Any]) -> float:
    return int(reply[0]) + int(reply[1]) / 1e6


# -- plans (what Schedules and AsyncSchedules send) ----------------------------------------


def add(found: Mapping[str, Any], replace: bool = False) -> Plan[str]:
    """Store a checked definition; "added" or "replaced"."""
    name = found["name"]
    text = json.dumps(found, separators=(",", ":"), allow_nan=False)
    if len(text) > MAX_DEFINITION_BYTES:
        raise ScheduleError(f"schedule {name!r}: its definition is {len(text)} bytes, over "
                            f"the {MAX_DEFINITION_BYTES}-byte cap")
    published, names, now = yield [("HGET", SCHEDULE_DEFS, name), ("HKEYS", SCHEDULES_RUNTIME),
                                   ("TIME",)]
    if _config_owned(_load(published), _now(now)):
        raise ScheduleError(f"schedule {name!r} is defined in a supervisor's config file: "
                            "change it there, or add this one under another name")
    taken = [n for n in names if not str(n).startswith("#")]
    if name not in taken and len(taken) >= MAX_SCHEDULES:
        raise ScheduleError(f"there are {len(taken)} run-time schedules, the most one Redis "
                            f"holds ({MAX_SCHEDULES}): remove one first")
    (reply,) = yield [cron.schedule_define_call("replace" if replace else "add", name, text)]
    outcome, _version = cron.parse_schedule_define(reply)
    if outcome == "exists":
        raise ScheduleError(f"schedule {name!r} exists already: remove it first, or replace it "
                            "(replace=True, forq schedule add --replace)")
    return outcome


def change(op: cron.ScheduleOp, name: str) -> Plan[str]:
    """remove, pause or resume a run-time schedule; its outcome (lua/schedule_define.lua)."""
    (reply, published, now) = yield [cron.schedule_define_call(op, name),
                                     ("HGET", SCHEDULE_DEFS, name), ("TIME",)]
    outcome, _version = cron.parse_schedule_define(reply)
    if outcome == "missing":
        if _config_owned(_load(published), _now(now)):
            raise ScheduleError(f"schedule {name!r} is defined in a supervisor's config file, "
                                f"which owns it: {op} it there")
        raise ScheduleNotFound(f"no run-time schedule named {name!r}")
    if op == "remove":
        yield [("HDEL", SCHEDULES, name)]  # its record: a schedule added again starts afresh
    return outcome


def trigger(name: str, force: bool = False) -> Plan[Triggered]:
    """Enqueue one run of schedule `name` now (run-time or a published config's), unless
    its overlap is "skip" and its last job is live (then nothing, unless `force`)."""
    runtime, published, record, now = yield [
        ("HGET", SCHEDULES_RUNTIME, name), ("HGET", SCHEDULE_DEFS, name),
        ("HGET", SCHEDULES, name), ("TIME",)]
    found = _load(published)
    if not _config_owned(found, _now(now)):
        found = _load(runtime)
    if not isinstance(found, dict):
        raise ScheduleNotFound(f"no schedule named {name!r} (at run time, or published by a "
                               "supervisor's config)")
    if "args" not in found or not isinstance(found.get("task"), str) \
            or not isinstance(found.get("queue"), str):
        raise ScheduleError(f"schedule {name!r} was published by an older supervisor, without "
                            "its arguments: trigger it once its supervisors run this version")
    keys = QueueKeys(found["queue"])
    _last, last_job, _skipped = _record(record)
    if found.get("overlap") == "skip" and last_job and not force:
        (state,) = yield [("HGET", keys.job(last_job), "state")]
        if state in LIVE:
            return Triggered(name, None, last_job, str(state))
    spec = build_spec(found["task"], {"args": found.get("args") or [],
                                      "kwargs": found.get("kwargs") or {}})
    enqueued = yield from plans.enqueue(keys, [spec], register=True)
    yield [cron.schedule_fired_call(name, "trigger", None, enqueued[0].id)]
    return Triggered(name, enqueued[0].id)


def rows(config_defs: Mapping[str, Mapping[str, Any]] | None = None) -> Plan[list[dict[str, Any]]]:
    """Every schedule with its last and next fire, for `forq schedules`, `forq schedule
    list` and the dashboard: those of `config_defs` alone when given (a config file's,
    `scheduler.config_defs`), else the run-time ones and those supervisors published
    (each with ``stale`` when none re-published it lately; long-gone ones are dropped)."""
    published, runtime, now_reply = yield [("HGETALL", SCHEDULE_DEFS),
                                           ("HGETALL", SCHEDULES_RUNTIME), ("TIME",)]
    now = _now(now_reply)
    config: dict[str, dict[str, Any]] = {}
    if config_defs is not None:
        config = {name: dict(d) for name, d in config_defs.items()}
    else:
        forget = []
        for key, raw in published.items():
            value = _load(raw)
            seen = _number(value.get("seen")) if isinstance(value, dict) else None
            if seen is None or now - seen > FORGET_AFTER:
                forget.append(str(key))  # unreadable (not a supervisor's) or long gone
            elif value.get("source", "config") == "config":
                config[str(key)] = value
        if forget:
            yield [("HDEL", SCHEDULE_DEFS, *forget)]
    extra = {str(k): _load(v) for k, v in runtime.items()
             if not str(k).startswith("#") and config_defs is None}
    names = sorted(set(config) | set(extra))
    records = (yield [("HMGET", SCHEDULES, *names)])[0] if names else []
    out = []
    for name, raw in zip(names, records, strict=True):
        last, job_id, skipped = _record(raw)
        if name in config:
            d = config[name]
            seen = _number(d.get("seen")) or now
            row = _row(name, d, "config", now, _number(d.get("next")))
            row["stale"] = now - seen > STALE_AFTER
            row["shadows"] = name in extra  # a run-time one of the same name: not run
        else:
            d = extra[name] if isinstance(extra[name], dict) else {}
            paused = f"#paused:{name}" in runtime
            row = _row(name, d, "runtime", now, None if paused else _next(d, now))
            row["paused"] = paused
        row.update(last_fired=last, last_job=job_id, skipped=skipped)
        out.append(row)
    return out


def _row(name: str, d: Mapping[str, Any], source: str, now: float,
         next_fire: float | None) -> dict[str, Any]:
    return {"name": name, "cron": str(d.get("cron", "")),
            "timezone": str(d.get("timezone") or "UTC"), "queue": str(d.get("queue", "")),
            "task": str(d.get("task", "")), "overlap": str(d.get("overlap") or "allow"),
            "source": source, "paused": False, "stale": False, "next_fire": next_fire}


def _next(d: Mapping[str, Any], now: float) -> float | None:
    """A run-time schedule's next tick (None when its definition is unusable)."""
    try:
        text, zone = str(d["cron"]), str(d.get("timezone") or "UTC")
        after = dt.datetime.fromtimestamp(now, dt.timezone.utc)
        return cron.next_after(text, cron.every_of(text, zone), zone, after).timestamp()
    except (KeyError, ValueError, StopIteration, OverflowError):
        return None


# -- the clients ---------------------------------------------------------------------------


class Schedules:
    """Run-time schedules on one Redis (a `redis.Redis`, e.g. `Queue(...).redis`)."""

    def __init__(self, client: Any) -> None:
        from forq.store.scripts import Scripts

        self.redis = client
        self.scripts = Scripts(client)

    def _run(self, plan: Plan[Any]) -> Any:
        from forq.store.pipelines import run_plan

        return run_plan(self.redis, self.scripts, plan)

    def add(self, name: str, cron: str, *, queue: str, task: str, replace: bool = False,
            **options: Any) -> str:
        """Add schedule `name`: enqueue `task` on `queue` at each tick of `cron` (as a
        config's: 5-field cron, a macro, "@every 30s"). Options: args, kwargs, timezone,
        catch_up ("latest"), max_catch_up (100), overlap ("allow" or "skip"). Refused
        (`ScheduleError`) when the name is taken, unless `replace`. Returns "added" or
        "replaced"; every supervisor runs it within about a second."""
        return str(self._run(add(definition(name, cron, queue=queue, task=task, **options),
                                 replace)))

    def remove(self, name: str) -> None:
        """Remove a run-time schedule (`ScheduleNotFound` if there is none)."""
        self._run(change("remove", name))

    def pause(self, name: str) -> bool:
        """No ticks until `resume`; False when it was paused already."""
        return bool(self._run(change("pause", name)) == "paused")

    def resume(self, name: str) -> bool:
        """Tick again from now on (the ticks missed while paused are not caught up);
        False when it was not paused."""
        return bool(self._run(change("resume", name)) == "resumed")

    def trigger(self, name: str, *, force: bool = False) -> Triggered:
        """One run of the schedule now, once (see `trigger`)."""
        done: Triggered = self._run(trigger(name, force))
        return done

    def list(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._run(rows())
        return found


class AsyncSchedules:
    """`Schedules` for asyncio code, on a ``redis.asyncio`` client: the same plans."""

    def __init__(self, client: Any) -> None:
        from forq.async_queue import AsyncScripts

        self.redis = client
        self.scripts = AsyncScripts()

    async def _run(self, plan: Plan[Any]) -> Any:
        try:
            commands = next(plan)
            while True:
                commands = plan.send(await self.scripts.send(self.redis, commands))
        except StopIteration as done:
            return done.value

    async def add(self, name: str, cron: str, *, queue: str, task: str,
                  replace: bool = False, **options: Any) -> str:
        return str(await self._run(add(definition(name, cron, queue=queue, task=task,
                                                  **options), replace)))

    async def remove(self, name: str) -> None:
        await self._run(change("remove", name))

    async def pause(self, name: str) -> bool:
        return bool(await self._run(change("pause", name)) == "paused")

    async def resume(self, name: str) -> bool:
        return bool(await self._run(change("resume", name)) == "resumed")

    async def trigger(self, name: str, *, force: bool = False) -> Triggered:
        done: Triggered = await self._run(trigger(name, force))
        return done

    async def list(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = await self._run(rows())
        return found
