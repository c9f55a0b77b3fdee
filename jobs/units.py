"""Human units for durations, sizes and rates.

Config files and CLI flags are written by people, so forq accepts "15s",
"256MiB" and "100/s" rather than bare numbers whose unit has to be guessed.
These functions are pure (no imports beyond the standard library) so both
the producer side (``jobs``) and the supervisor can use them, and every
error says what was expected and what was given, prefixed by where it came
from (e.g. ``[supervisor].lease_ttl``), so a typo never ends in a traceback.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import time
from typing import Any

__all__ = [
    "UnitError",
    "describe_value",
    "format_duration",
    "format_size",
    "parse_duration",
    "parse_rate",
    "parse_size",
]


class UnitError(ValueError):
    """A value could not be read as a duration, size or rate.

    A ``ValueError`` so callers that only care about "bad value" can catch
    the broad class; its message is one line, ready to show to a user.
    """


# Duration units, longest spelling first is not needed: the regex below
# takes the whole alphabetic run and looks it up here.
_DURATION_UNITS: dict[str, float] = {
    "ms": 0.001,
    "msec": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}

# Binary units (KiB = 1024) are what memory limits are usually meant in;
# SI units (KB = 1000) are accepted because people write them, and they
# mean what the SI says.  Single letters ("512M") are refused: whether
# they are 1000 or 1024 differs between tools, so we make the user say.
_SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION_PART = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Z]+)")
_SIZE_RE = re.compile(rf"\s*({_NUMBER})\s*([a-zA-Z]*)\s*")
_RATE_RE = re.compile(rf"\s*({_NUMBER})\s*/\s*(.+?)\s*")

_DURATION_HINT = 'a duration such as "250ms", "15s" or "5m"'
_SIZE_HINT = 'a size such as "64KiB", "256MiB" or "1GiB"'
_RATE_HINT = 'a rate such as "100/s", "50/m" or "3/h"'


def describe_value(value: object) -> str:
    """Render a config value the way the user wrote it, for error messages.

    Strings are shown in double quotes and booleans as ``true``/``false``
    so the message reads like the TOML the user is looking at, not like
    Python's ``repr``.
    """
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(describe_value(v) for v in value) + "]"
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    return repr(value)


def _fail(where: str, hint: str, value: object) -> UnitError:
    message = f"expected {hint}, got {describe_value(value)}"
    return UnitError(f"{where}: {message}" if where else message)


def _plain_number(value: object) -> float | None:
    """Return a finite, non-negative int/float, or None; bools are not numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    if not math.isfinite(number) or number < 0:
        return None
    return number


def parse_duration(value: object, *, where: str = "") -> float:
    """Return a duration in seconds from ``15``, ``1.5``, ``"250ms"``, ``"1m30s"``...

    Bare numbers (and numeric strings) are seconds.  Strings take a unit:
    ms, s, m, h, d (long forms such as "min" or "hours" too), and may
    combine units largest first ("1h30m", "1m30s").  Negative, infinite or
    NaN values are refused: no forq setting means a negative time.
    """
    number = _plain_number(value)
    if number is not None:
        return number
    if not isinstance(value, str):
        raise _fail(where, _DURATION_HINT, value)
    text = value.strip()
    if re.fullmatch(_NUMBER, text):
        return float(text)
    total = 0.0
    position = 0
    last_scale = math.inf
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            break
        scale = _DURATION_UNITS.get(match.group(2).lower())
        # Units must be known and strictly decreasing ("1m30s", not "30s1m"
        # or "1s1s"), which catches most typos in composite durations.
        if scale is None or scale >= last_scale:
            raise _fail(where, _DURATION_HINT, value)
        last_scale = scale
        total += float(match.group(1)) * scale
        position = match.end()
    if position == 0 or position != len(text):
        raise _fail(where, _DURATION_HINT, value)
    return total


def parse_size(value: object, *, where: str = "") -> int:
    """Return a size in bytes from ``512``, ``"512"``, ``"256MiB"``, ``"10MB"``, ``"1.5GiB"``.

    KiB/MiB/GiB/TiB are powers of 1024 and KB/MB/GB/TB powers of 1000
    (case-insensitive); "B" is bytes.  Fractions are rounded to the nearest
    byte.  A bare "M" or "G" is refused because tools disagree on it.
    """
    number = _plain_number(value)
    if number is not None:
        return int(round(number))
    if not isinstance(value, str):
        raise _fail(where, _SIZE_HINT, value)
    match = _SIZE_RE.fullmatch(value)
    if match is None:
        raise _fail(where, _SIZE_HINT, value)
    amount, unit = match.groups()
    scale = _SIZE_UNITS.get(unit.lower()) if unit else 1
    if scale is None:
        raise _fail(where, _SIZE_HINT, value)
    return int(round(float(amount) * scale))


def parse_rate(value: object, *, where: str = "") -> tuple[float, float]:
    """Return ``(count, period_seconds)`` from ``"100/s"``, ``"50/m"``, ``"3/h"`` or ``"10/5s"``.

    Kept as a pair rather than one "per second" float so a limit such as
    3/h can be enforced over its real window instead of as 0.00083/s.
    Both parts must be greater than zero: a rate of 0 would stop a queue
    silently, and stopping a queue has its own, explicit switches.
    """
    if not isinstance(value, str):
        raise _fail(where, _RATE_HINT, value)
    match = _RATE_RE.fullmatch(value)
    if match is None:
        raise _fail(where, _RATE_HINT, value)
    count = float(match.group(1))
    period_text = match.group(2)
    if not re.match(r"[\d.]", period_text):
        period_text = "1" + period_text
    try:
        period = parse_duration(period_text)
    except UnitError:
        raise _fail(where, _RATE_HINT, value) from None
    # A bare number after the slash ("100/5") has no unit: refuse it rather
    # than guess seconds, since the unit is the point of writing a rate.
    if count <= 0 or period <= 0 or re.fullmatch(_NUMBER, period_text.strip()):
        raise _fail(where, _RATE_HINT, value)
    return count, period


def format_duration(seconds: float) -> str:
    """Format seconds for people: ``"340ms"``, ``"1.2s"``, ``"15s"``, ``"1m30s"``, ``"2h"``.

    The output is accepted by :func:`parse_duration`, so what a log line or
    ``forq`` command prints can be pasted back into a config.  Above a
    minute it is rounded to whole seconds.
    """
    if not math.isfinite(seconds):
        return str(seconds)
    sign = "-" if seconds < 0 else ""
    s = abs(float(seconds))
    if s == 0:
        return "0s"
    if s < 1:
        ms = s * 1000
        if ms < 1:
            return f"{sign}{ms:.2g}ms"
        if round(ms) < 1000:
            return f"{sign}{round(ms)}ms"
        s = 1.0
    tenths = round(s * 10)
    if tenths < 600:
        if tenths % 10 == 0:
            return f"{sign}{tenths // 10}s"
        return f"{sign}{tenths / 10:.1f}s"
    rest = round(s)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, rest = divmod(rest, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return sign + "".join(parts)


def format_size(n: int) -> str:
    """Format a byte count for people: ``"512B"``, ``"64.0KiB"``, ``"256.0MiB"``.

    Binary units, one decimal, so memory figures in logs and metrics line up
    with how limits are usually written; accepted by :func:`parse_size`.
    """
    sign = "-" if n < 0 else ""
    size = abs(int(n))
    if size < 1024:
        return f"{sign}{size}B"
    units = ("KiB", "MiB", "GiB", "TiB", "PiB")
    for power, unit in enumerate(units, start=1):
        shown = round(size / 1024**power, 1)
        if shown < 1024 or unit == units[-1]:
            return f"{sign}{shown:.1f}{unit}"
    raise AssertionError("unreachable")


# -- for people: times and rates as the CLI and the dashboard show them ---------------


def when(seconds: float | None, *, date: bool = True) -> str:
    """Local time of a Unix timestamp in seconds, to the millisecond; "-" for none."""
    if not seconds:
        return "-"
    fmt = "%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S"
    return time.strftime(fmt, time.localtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}"


def when_ms(ms: Any) -> str:
    """`when` for the millisecond fields of a job record."""
    try:
        return when(int(ms) / 1000.0)
    except (TypeError, ValueError):
        return "-"


def age(seconds: float | None) -> str:
    """A duration for people ("340ms", "12s", "1h5m"), "-" for none."""
    return "-" if seconds is None else format_duration(max(0.0, seconds))


def relative(then: float, now: float) -> str:
    """"12s ago" or "in 12s"."""
    delta = then - now
    return f"in {age(delta)}" if delta >= 0 else f"{age(-delta)} ago"


def rate(per_second: float | None) -> str:
    """A rate in the largest unit that reads as at least one: "50/s", "30/m", "3/h"."""
    if not per_second:
        return "none"
    for unit, scale in (("s", 1), ("m", 60), ("h", 3600)):
        amount = per_second * scale
        if amount >= 1 or unit == "h":
            return f"{amount:.6g}/{unit}"
    raise AssertionError("unreachable")
