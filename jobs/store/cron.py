"""Schedule expressions: 5-field cron (by cronsim), the usual macros, ``@every <duration>``,
read in an IANA time zone. Here, not in the supervisor's config, because a producer
adding a schedule at run time (`forq.schedules`) checks its expression and shows its next
tick too; the supervisor's `[[schedule]]` entries use the same functions.

Every supervisor computes the same tick times: cron ticks by cronsim in the schedule's
zone, ``@every`` ticks as multiples of the interval since the Unix epoch (not "interval
after start"), so they agree through Redis on who enqueues each tick.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import cronsim

from forq.store.keys import SCHEDULES, SCHEDULES_RUNTIME
from forq.store.transitions import ScriptCall
from forq.units import UnitError, parse_duration

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICROSECOND = dt.timedelta(microseconds=1)


class CronError(ValueError):
    """A schedule expression or time zone that cannot be used: `expected` says what
    would be (for a config error "expected X, got Y"), `str()` the whole sentence."""

    def __init__(self, expected: str, message: str) -> None:
        super().__init__(message)
        self.expected = expected


def zone(timezone: str) -> ZoneInfo:
    """The IANA time zone named `timezone`; `CronError` if there is none."""
    expected = 'an IANA time zone such as "UTC" or "Europe/Paris"'
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise CronError(expected, f"expected {expected}, got {timezone!r}") from None


def every_of(cron: str, timezone: str = "UTC") -> float | None:
    """Check `cron` (read in `timezone`); the interval in seconds of ``@every
    <duration>``, None for a cron expression or macro. `CronError` when it is not one,
    or never fires."""
    text = cron.strip()
    if text.lower().startswith("@every"):
        rest = text[len("@every"):].strip()
        expected = '"@every <duration>" such as "@every 30s"'
        if not rest:
            raise CronError(expected, f"expected {expected}, got {cron!r}")
        try:
            seconds = parse_duration(rest, where="@every")
        except UnitError:
            raise CronError(expected, f"expected {expected}, got {cron!r}") from None
        if seconds <= 0:
            raise CronError(expected, f"expected {expected} of more than 0, got {cron!r}")
        return seconds
    if text.startswith("@"):
        if text.lower() not in MACROS:
            expected = f"one of {', '.join(sorted(MACROS))} or @every <duration>"
            raise CronError(expected, f"expected {expected}, got {cron!r}")
        return None
    expected = 'a 5-field cron expression such as "0 3 * * *"'
    if len(text.split()) != 5:
        raise CronError(expected, f"expected {expected}, got {cron!r}")
    try:
        next(cronsim.CronSim(text, dt.datetime.now(zone(timezone))))
    except cronsim.CronSimError as exc:
        raise CronError(f"a valid cron expression ({exc})",
                        f"expected a valid cron expression ({exc}), got {cron!r}") from None
    except StopIteration:
        raise CronError("", f"{cron!r} never fires") from None
    return None


def next_after(cron: str, every: float | None, timezone: str, after: dt.datetime) -> dt.datetime:
    """The first tick strictly after the aware datetime `after`, in the schedule's zone.
    `every` is `every_of(cron)` (given, so it is parsed once)."""
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValueError("next_after needs an aware datetime (with tzinfo)")
    tz = zone(timezone)
    if every is not None:
        step = max(1, round(every * 1_000_000))
        since_epoch = (after - _EPOCH) // _MICROSECOND
        tick = (since_epoch // step + 1) * step
        return (_EPOCH + dt.timedelta(microseconds=tick)).astimezone(tz)
    expression = MACROS.get(cron.strip().lower(), cron)
    return next(cronsim.CronSim(expression, after.astimezone(tz)))


# -- the schedules' script calls (not a queue's: the scripts touch one global hash each) --------------------


ScheduleOp = Literal["add", "replace", "remove", "pause", "resume"]


def schedule_define_call(op: ScheduleOp, name: str, definition: str = "") -> ScriptCall:
    """Add, replace (definition: JSON), remove, pause or resume a run-time schedule."""
    return ScriptCall("schedule_define", (SCHEDULES_RUNTIME,), (op, name, definition))


def parse_schedule_define(reply: Sequence[Any]) -> tuple[str, int]:
    """(outcome, version): see lua/schedule_define.lua."""
    return str(reply[0]), int(reply[1])


def schedule_fired_call(name: str, mode: Literal["tick", "skip", "trigger"], tick: float | None,
                        job_id: str = "") -> ScriptCall:
    """Record a schedule's tick (fired or skipped) or a manual trigger's job."""
    return ScriptCall("schedule_fired", (SCHEDULES,),
                      (name, mode, "" if tick is None else repr(float(tick)), job_id))
