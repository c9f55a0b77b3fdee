"""`[[schedule]]` entries: cron expressions (by cronsim), `@every <duration>`, time zones
and catch-up, checked when the config loads so a bad expression is one clear line."""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import cronsim

from forq.supervisor.config import fields as read
from forq.units import describe_value

_SCHEDULE_KEYS = (
    "name",
    "cron",
    "timezone",
    "queue",
    "task",
    "args",
    "kwargs",
    "catch_up",
    "max_catch_up",
)
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



@dataclass(frozen=True)
class ScheduleConfig:
    """One ``[[schedule]]`` entry: enqueue ``task`` on ``queue`` at each tick.

    ``cron`` is the expression as written; ``every`` is set (seconds) only
    for ``@every <duration>``.  ``args``/``kwargs`` are JSON-compatible.
    """

    name: str
    cron: str
    queue: str
    task: str
    timezone: str = "UTC"
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    catch_up: str = "latest"
    max_catch_up: int = 100
    every: float | None = None

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
        read.check_keys(table, _SCHEDULE_KEYS, prefix)
        for required in ("name", "cron", "queue", "task"):
            if required not in table:
                raise read.Invalid(f"{prefix}: missing required key {required}")
        name = read.simple_name(table["name"], f"{prefix}.name")
        if name in seen:
            raise read.Invalid(f'{prefix}.name: duplicate schedule "{name}"')
        seen.add(name)
        timezone = read.string(
            table.get("timezone", "UTC"), f"{prefix}.timezone", 'an IANA time zone such as "UTC"'
        )
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise read.expected(
                f"{prefix}.timezone", 'an IANA time zone such as "UTC" or "Europe/Paris"', timezone
            ) from None
        cron = read.string(table["cron"], f"{prefix}.cron", 'a cron expression such as "0 3 * * *"')
        every = _cron(cron, timezone, f"{prefix}.cron")
        args = table.get("args", [])
        if not isinstance(args, list):
            raise read.expected(f"{prefix}.args", "a list", args)
        kwargs = table.get("kwargs", {})
        if not isinstance(kwargs, dict):
            raise read.expected(f"{prefix}.kwargs", "a table", kwargs)
        for key, value in (("args", args), ("kwargs", kwargs)):
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError):
                raise read.Invalid(
                    f"{prefix}.{key}: must be JSON values (TOML dates, times, inf and nan are not)"
                ) from None
        schedules.append(
            ScheduleConfig(
                name=name,
                cron=cron,
                queue=read.simple_name(table["queue"], f"{prefix}.queue", read.QUEUE_NAME_RE),
                task=read.string(table["task"], f"{prefix}.task", "a task name"),
                timezone=timezone,
                args=args,
                kwargs=kwargs,
                catch_up=read.choice(table.get("catch_up", "latest"), f"{prefix}.catch_up", _CATCH_UP),
                max_catch_up=read.integer(table.get("max_catch_up", 100), f"{prefix}.max_catch_up", 1),
                every=every,
            )
        )
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
