"""Readers for one configuration value each: they take the value and where it was
found ("[queue 2].concurrency") and return it checked, or raise `Invalid` with
"where: expected …, got …" — the one line a user sees for a mistake in the TOML.

A schema row (`schema.Key`) holds a `Reader`: one of these functions with its bounds
bound in, and `what` it expects, which the reference page shows in its type column."""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from forq.units import UnitError, describe_value, parse_duration, parse_rate, parse_size

# Names end up inside Redis keys ("forq:{emails}:pending") and process
# titles, so keep them to characters that need no quoting anywhere.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]*")
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")


class Invalid(Exception):
    """A problem found inside the document; the loader prefixes the file name."""


def toml_key(name: str) -> str:
    return name if BARE_KEY_RE.fullmatch(name) else json.dumps(name, ensure_ascii=False)


def expected(where: str, what: str, value: object) -> Invalid:
    return Invalid(f"{where}: expected {what}, got {describe_value(value)}")


def check_keys(table: Mapping[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    """Refuse keys we do not know, suggesting the closest one we do."""
    for key in table:
        if key in allowed:
            continue
        where = f"{prefix}.{toml_key(key)}" if prefix else toml_key(key)
        if not prefix and isinstance(table[key], (dict, list)):
            where = f"[{toml_key(key)}]"
        message = f"unknown key {where}"
        close = difflib.get_close_matches(key, allowed, n=1)
        if close:
            message += f" (did you mean {close[0]}?)"
        raise Invalid(message)


def table(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise expected(where, "a table", value)
    return value


def _integer_what(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"an integer from {minimum} to {maximum}"
    if minimum is not None:
        return f"an integer >= {minimum}"
    return "an integer"


def integer(value: object, where: str, minimum: int | None = None, maximum: int | None = None) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool)
    if ok and minimum is not None and value < minimum:  # type: ignore[operator]
        ok = False
    if ok and maximum is not None and value > maximum:  # type: ignore[operator]
        ok = False
    if not ok:
        raise expected(where, _integer_what(minimum, maximum), value)
    return value  # type: ignore[return-value]


def boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise expected(where, "true or false", value)
    return value


def number(
    value: object, where: str, what: str, minimum: float, maximum: float = math.inf
) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not minimum <= value <= maximum
    ):
        raise expected(where, what, value)
    return float(value)


def string(value: object, where: str, what: str = "a string") -> str:
    if not isinstance(value, str) or not value.strip():
        raise expected(where, what, value)
    return value


def choice(value: object, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise expected(where, "one of " + ", ".join(f'"{c}"' for c in choices), value)
    return str(value)


def simple_name(value: object, where: str, pattern: re.Pattern[str] = NAME_RE) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise expected(where, "a name of letters, digits, '_', '.' or '-'", value)
    return value


def duration(value: object, where: str, *, positive: bool = False) -> float:
    try:
        seconds = parse_duration(value, where=where)
    except UnitError as exc:
        raise Invalid(str(exc)) from None
    if positive and seconds <= 0:
        raise expected(where, 'a duration > 0 such as "250ms", "15s" or "5m"', value)
    return seconds


def ms(value: object, where: str, *, positive: bool = False) -> int:
    return int(round(duration(value, where, positive=positive) * 1000))


def size(value: object, where: str, *, minimum: int = 0) -> int:
    try:
        size = parse_size(value, where=where)
    except UnitError as exc:
        raise Invalid(str(exc)) from None
    if size < minimum:
        raise expected(
            where, f'a size of at least {bytes_text(minimum)} such as "64KiB" or "1MiB"', value
        )
    return size


def rate(value: object, where: str) -> tuple[float, float]:
    try:
        return parse_rate(value, where=where)
    except UnitError as exc:
        raise Invalid(str(exc)) from None


def listen(value: object, where: str) -> tuple[str, int] | None:
    """An address to listen on, "host:port" ("[::1]:9464" for IPv6), or "" for none."""
    if value == "":
        return None
    what = 'host:port such as "127.0.0.1:9464" (or "" for off)'
    if not isinstance(value, str):
        raise expected(where, what, value)
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise expected(where, what, value)
    return host, int(port)


def string_list(value: object, where: str, what: str) -> list[str]:
    if not isinstance(value, list):
        raise expected(where, f"a list of {what}", value)
    for index, item in enumerate(value):
        string(item, f"{where}[{index}]", what)
    return list(value)


# --------------------------------------------------------------------------
# Readers with their bounds bound in, for schema rows


@dataclass(frozen=True)
class Reader:
    """Reads one key's value: ``reader(value, where)`` returns it checked (or raises
    `Invalid`); `what` is the kind of value it takes, as the reference page shows it."""

    what: str
    read: Callable[[object, str], Any]

    def __call__(self, value: object, where: str) -> Any:
        return self.read(value, where)


def number_what(minimum: float, maximum: float = math.inf) -> str:
    if maximum == math.inf:
        return f"a number >= {minimum}"
    return f"a number from {minimum} to {maximum}"


def bytes_text(n: int) -> str:
    """A byte count as a config would write it: "1MiB", "64KiB", "1 byte"."""
    for unit, power in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n and n % (1 << power) == 0:
            return f"{n >> power}{unit}"
    return f"{n} byte" if n == 1 else f"{n} bytes"


def integers(minimum: int | None = None, maximum: int | None = None) -> Reader:
    return Reader(_integer_what(minimum, maximum),
                  lambda value, where: integer(value, where, minimum, maximum))


def numbers(minimum: float, maximum: float = math.inf, what: str = "") -> Reader:
    what = what or number_what(minimum, maximum)
    return Reader(what, lambda value, where: number(value, where, what, minimum, maximum))


def durations(*, positive: bool = False) -> Reader:
    return Reader("a duration > 0" if positive else "a duration",
                  lambda value, where: duration(value, where, positive=positive))


def milliseconds(*, positive: bool = False) -> Reader:
    """A duration, read into the integer milliseconds a job record stores."""
    return Reader("a duration > 0" if positive else "a duration",
                  lambda value, where: ms(value, where, positive=positive))


def sizes(*, minimum: int = 0) -> Reader:
    return Reader(f"a size >= {bytes_text(minimum)}" if minimum else "a size",
                  lambda value, where: size(value, where, minimum=minimum))


def choices(*options: str) -> Reader:
    return Reader("one of " + ", ".join(f'"{c}"' for c in options),
                  lambda value, where: choice(value, where, options))


def names(pattern: re.Pattern[str] = NAME_RE) -> Reader:
    return Reader("a name of letters, digits, '_', '.' or '-'",
                  lambda value, where: simple_name(value, where, pattern))


def strings(what: str = "a string") -> Reader:
    return Reader(what, lambda value, where: string(value, where, what))


def version(value: object, where: str) -> str:
    """A code version label, or "" for none ([supervisor].version): no '+', which
    separates it from the fingerprint in job records, nothing to quote."""
    if value != "" and not (isinstance(value, str) and VERSION_RE.fullmatch(value)):
        raise expected(where, VERSION.what, value)
    return str(value)


VERSION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:~-]{0,63}")
VERSION = Reader("up to 64 letters, digits, '.', '_', ':', '~' or '-'", version)
BOOLEAN = Reader("true or false", boolean)
RATE = Reader('a rate such as "100/s"', rate)
LISTEN = Reader('host:port, or "" for off', listen)
