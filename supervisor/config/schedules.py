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

import cronsim

from forq.supervisor.config import fields as read
from forq.supervisor.config import schema
from forq.supervisor.config.schema import REQUIRED, key
from forq.units import describe_value

SCOPE = "[[schedule]]"
_CATCH_UP = ("none", "latest", "all")

# cronsim only takes field expressions; these are the usual cron macros.
_CRON_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_MICROSECOND = _dt.timedelta(microseconds=1)


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
    every: float | None = None  # from cron: the interval of "@every <duration>"

    @property
    def tzinfo(self) -> ZoneInfo:
        """The schedule's time zone, in which cron fields are read."""
        return ZoneInfo(self.timezone)

    def next_after(self, dt: _dt.datetime) -> _dt.datetime:
        """Return the first tick strictly after the aware datetime ``dt``.

        ``@every`` ticks are multiples of the interval since the Unix epoch,
        not "interval after start", so every supervisor computes the same
        tick times and can agree (via Redis) on who enqueues each one.  Cron
        ticks are computed by cronsim in the schedule's time zone (with its
        Debian-cron-like DST handling).  The result is in that time zone.
        """
        if dt.tzinfo is None or dt.utcoffset() is None:
            raise ValueError("next_after needs an aware datetime (with tzinfo)")
        tz = self.tzinfo
        if self.every is not None:
            step = max(1, round(self.every * 1_000_000))
            since_epoch = (dt - _EPOCH) // _MICROSECOND
            tick = (since_epoch // step + 1) * step
            return (_EPOCH + _dt.timedelta(microseconds=tick)).astimezone(tz)
        expression = _CRON_MACROS.get(self.cron.strip().lower(), self.cron)
        return next(cronsim.CronSim(expression, dt.astimezone(tz)))



ROWS = schema.rows(ScheduleConfig, SCOPE)


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
        found = schema.read_rows(table, ROWS, prefix)
        if found["name"] in seen:
            raise read.Invalid(f'{prefix}.name: duplicate schedule "{found["name"]}"')
        seen.add(found["name"])
        schedule = ScheduleConfig(**found)
        every = _cron(schedule.cron, schedule.timezone, f"{prefix}.cron")
        schedules.append(dataclasses.replace(schedule, every=every))
    return schedules


def _cron(cron: str, timezone: str, where: str) -> float | None:
    """Validate a schedule expression; return the interval for ``@every``."""
    text = cron.strip()
    if text.lower().startswith("@every"):
        rest = text[len("@every") :].strip()
        if not rest:
            raise read.expected(where, '"@every <duration>" such as "@every 30s"', cron)
        return read.duration(rest, where, positive=True)
    if text.startswith("@"):
        expression = _CRON_MACROS.get(text.lower())
        if expression is None:
            macros = ", ".join(sorted(_CRON_MACROS))
            raise read.expected(where, f"one of {macros} or @every <duration>", cron)
        return None
    if len(text.split()) != 5:
        raise read.expected(where, 'a 5-field cron expression such as "0 3 * * *"', cron)
    try:
        next(cronsim.CronSim(text, _dt.datetime.now(ZoneInfo(timezone))))
    except cronsim.CronSimError as exc:
        raise read.expected(where, f"a valid cron expression ({exc})", cron) from None
    except StopIteration:
        raise read.Invalid(f"{where}: {describe_value(cron)} never fires") from None
    return None
