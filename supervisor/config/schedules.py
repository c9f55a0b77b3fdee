"""`[[schedule]]` entries: cron expressions (by cronsim), `@every <duration>`, time zones
and catch-up, checked when the config loads so a bad expression is one clear line.
Each field of `ScheduleConfig` but `every` is the row of its key (`schema.key`)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from forq.store import cron as cron_lib
from forq.supervisor.config import fields as read
from forq.supervisor.config import schema
from forq.supervisor.config.schema import REQUIRED, key
from forq.units import describe_value

SCOPE = "[[schedule]]"
_CATCH_UP = ("none", "latest", "all")
_OVERLAP = ("allow", "skip")


def _timezone(value: object, where: str) -> str:
    timezone = read.string(value, where, 'an IANA time zone such as "UTC"')
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise read.expected(
            where, 'an IANA time zone such as "UTC" or "Europe/Paris"', timezone
        ) from None
    return timezone


def _json(value: object, where: str) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise read.Invalid(
            f"{where}: must be JSON values (TOML dates, times, inf and nan are not)"
        ) from None


def _args(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise read.expected(where, "a list", value)
    _json(value, where)
    return value


def _kwargs(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise read.expected(where, "a table", value)
    _json(value, where)
    return value


@dataclass(frozen=True)
class ScheduleConfig:
    """One ``[[schedule]]`` entry: enqueue ``task`` on ``queue`` at each tick.

    ``cron`` is the expression as written; ``every`` is set (seconds) only
    for ``@every <duration>``.  ``args``/``kwargs`` are JSON-compatible.
    """

    name: str = key(REQUIRED, read.names(), "The schedule's name, unique in this file.")
    cron: str = key(REQUIRED, read.strings('a cron expression such as "0 3 * * *"'),
                    '5-field cron (`"0 3 * * *"`), a macro (`@daily`, …) or `"@every 30s"`.')
    queue: str = key(REQUIRED, read.names(read.QUEUE_NAME_RE),
                     "The queue each tick's job goes to (served here or not).")
    task: str = key(REQUIRED, read.strings("a task name"), "The task each tick's job runs.")
    timezone: str = key("UTC", read.Reader("an IANA time zone", _timezone),
                        "The time zone the cron fields are read in.")
    args: list[Any] = key([], read.Reader("a list of JSON values", _args),
                          "The job's positional arguments.")
    kwargs: dict[str, Any] = key({}, read.Reader("a table of JSON values", _kwargs),
                                 "The job's keyword arguments.")
    catch_up: str = key("latest", read.choices(*_CATCH_UP),
                        "After downtime: skip missed ticks, run the latest, or run each.")
    max_catch_up: int = key(100, read.integers(1), 'At most this many missed ticks, for `"all"`.')
    overlap: str = key("allow", read.choices(*_OVERLAP),
                       '`"skip"`: no tick while the last tick\'s job is pending, scheduled, '
                       'waiting or running.')
    every: float | None = None  # from cron: the interval of "@every <duration>"

    @property
    def tzinfo(self) -> ZoneInfo:
        """The schedule's time zone, in which cron fields are read."""
        return ZoneInfo(self.timezone)

    def next_after(self, dt: _dt.datetime) -> _dt.datetime:
        """Return the first tick strictly after the aware datetime ``dt``, in the
        schedule's time zone (`forq.store.cron.next_after`: ``@every`` ticks are
        multiples of the interval since the Unix epoch, so every supervisor computes
        the same ones; cron ticks by cronsim, with its Debian-cron-like DST handling)."""
        return cron_lib.next_after(self.cron, self.every, self.timezone, dt)


ROWS = schema.rows(ScheduleConfig, SCOPE)


def read_schedule(table: Mapping[str, Any], prefix: str) -> ScheduleConfig:
    """One schedule's table (a `[[schedule]]` entry, or a schedule added at run time and
    stored in Redis as the same table), checked; errors start with `prefix`."""
    schedule = ScheduleConfig(**schema.read_rows(table, ROWS, prefix))
    every = _cron(schedule.cron, schedule.timezone, f"{prefix}.cron")
    return dataclasses.replace(schedule, every=every)


def read_schedules(doc: Mapping[str, Any]) -> list[ScheduleConfig]:
    raw = doc.get("schedule", [])
    if not isinstance(raw, list):
        raise read.expected("schedule", "an array of tables written [[schedule]]", raw)
    schedules: list[ScheduleConfig] = []
    seen: set[str] = set()
    for index, item in enumerate(raw, start=1):
        prefix = f"[schedule {index}]"
        table = read.table(item, prefix)
        if isinstance(table.get("name"), str) and table["name"]:
            prefix = f"[schedule {json.dumps(table['name'], ensure_ascii=False)}]"
        schedule = read_schedule(table, prefix)
        if schedule.name in seen:
            raise read.Invalid(f'{prefix}.name: duplicate schedule "{schedule.name}"')
        seen.add(schedule.name)
        schedules.append(schedule)
    return schedules


def _cron(cron: str, timezone: str, where: str) -> float | None:
    """Validate a schedule expression; return the interval for ``@every``."""
    text = cron.strip()
    if text.lower().startswith("@every"):
        rest = text[len("@every") :].strip()
        if not rest:
            raise read.expected(where, '"@every <duration>" such as "@every 30s"', cron)
        return read.duration(rest, where, positive=True)
    try:
        return cron_lib.every_of(cron, timezone)
    except cron_lib.CronError as exc:
        if exc.expected:
            raise read.expected(where, exc.expected, cron) from None
        raise read.Invalid(f"{where}: {describe_value(cron)} never fires") from None
