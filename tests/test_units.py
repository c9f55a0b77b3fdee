"""Tests for forq.units: every accepted spelling, every refusal and its message."""

import datetime as dt
import math

import pytest

from forq.units import (
    UnitError,
    describe_value,
    format_duration,
    format_size,
    parse_duration,
    parse_rate,
    parse_size,
)

DURATION_HINT = 'expected a duration such as "250ms", "15s" or "5m"'
SIZE_HINT = 'expected a size such as "64KiB", "256MiB" or "1GiB"'
RATE_HINT = 'expected a rate such as "100/s", "50/m" or "3/h"'


# -- parse_duration ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (15, 15.0),
        (1.5, 1.5),
        ("15", 15.0),
        ("0.25", 0.25),
        ("250ms", 0.25),
        ("15s", 15.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("1m30s", 90.0),
        ("1h30m", 5400.0),
        ("1d2h3m4s5ms", 86400 + 7200 + 180 + 4 + 0.005),
        ("1m 30s", 90.0),
        (" 15 s ", 15.0),
        ("15S", 15.0),
        ("2 minutes", 120.0),
        ("3 hours", 10800.0),
        ("10sec", 10.0),
        ("0s", 0.0),
    ],
)
def test_parse_duration_accepts(value, seconds):
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    [
        "5 parsecs",
        "",
        "   ",
        "s",
        "ms15",
        "15x",
        "-5s",
        "30s1m",  # units must go largest first
        "1s1s",  # and not repeat
        "1m30",  # a composite needs a unit on every part
        "1.2.3s",
        "nan",
        "inf",
        -1,
        float("inf"),
        float("nan"),
        True,
        None,
        [1, 2],
        {"s": 1},
    ],
)
def test_parse_duration_refuses(value):
    with pytest.raises(UnitError) as info:
        parse_duration(value)
    assert str(info.value).startswith(DURATION_HINT + ", got ")


def test_parse_duration_message_shape():
    with pytest.raises(UnitError) as info:
        parse_duration("5 parsecs")
    assert str(info.value) == f'{DURATION_HINT}, got "5 parsecs"'


def test_parse_duration_where_prefix():
    with pytest.raises(UnitError) as info:
        parse_duration("5 parsecs", where="[supervisor].lease_ttl")
    assert str(info.value) == f'[supervisor].lease_ttl: {DURATION_HINT}, got "5 parsecs"'


def test_unit_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_parse_duration_shows_non_strings_as_toml():
    with pytest.raises(UnitError) as info:
        parse_duration(True)
    assert str(info.value).endswith("got true")
    with pytest.raises(UnitError) as info:
        parse_duration(-3)
    assert str(info.value).endswith("got -3")


# -- parse_size --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (0, 0),
        (512, 512),
        (512.0, 512),
        ("512", 512),
        ("512B", 512),
        ("100 b", 100),
        ("64KiB", 64 * 1024),
        ("256MiB", 256 * 1024**2),
        ("1GiB", 1024**3),
        ("2TiB", 2 * 1024**4),
        ("1.5GiB", 1536 * 1024**2),
        ("10MB", 10_000_000),
        ("1kb", 1000),
        ("3GB", 3 * 10**9),
        ("1TB", 10**12),
        ("256mib", 256 * 1024**2),
        (" 1 GiB ", 1024**3),
        ("0.5KiB", 512),
    ],
)
def test_parse_size_accepts(value, size):
    result = parse_size(value)
    assert result == size
    assert isinstance(result, int)


@pytest.mark.parametrize(
    "value",
    [
        "512M",
        "1G",
        "lots",
        "",
        "GiB",
        "1.5 XB",
        "-1KiB",
        "1 2 MiB",
        -1,
        True,
        None,
        [512],
        math.inf,
    ],
)
def test_parse_size_refuses(value):
    with pytest.raises(UnitError) as info:
        parse_size(value)
    assert str(info.value).startswith(SIZE_HINT + ", got ")


def test_parse_size_message_and_where():
    with pytest.raises(UnitError) as info:
        parse_size("512M", where="[defaults].memory_limit")
    assert str(info.value) == f'[defaults].memory_limit: {SIZE_HINT}, got "512M"'


# -- parse_rate --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "rate"),
    [
        ("100/s", (100.0, 1.0)),
        ("50/m", (50.0, 60.0)),
        ("3/h", (3.0, 3600.0)),
        ("1/d", (1.0, 86400.0)),
        ("10/5s", (10.0, 5.0)),
        ("1.5/s", (1.5, 1.0)),
        (" 100 / s ", (100.0, 1.0)),
        ("20/500ms", (20.0, 0.5)),
        ("6/1m30s", (6.0, 90.0)),
        ("100/second", (100.0, 1.0)),
    ],
)
def test_parse_rate_accepts(value, rate):
    assert parse_rate(value) == pytest.approx(rate)


@pytest.mark.parametrize(
    "value",
    [
        "100",
        "100/",
        "/s",
        "0/s",
        "100/0s",
        "100/5",
        "fast",
        "100/parsec",
        "-1/s",
        "1/s/s",
        100,
        None,
        True,
    ],
)
def test_parse_rate_refuses(value):
    with pytest.raises(UnitError) as info:
        parse_rate(value)
    assert str(info.value).startswith(RATE_HINT + ", got ")


def test_parse_rate_message_and_where():
    with pytest.raises(UnitError) as info:
        parse_rate("fast", where="[queue 1].rate_limit")
    assert str(info.value) == f'[queue 1].rate_limit: {RATE_HINT}, got "fast"'


# -- formatting --------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0005, "0.5ms"),
        (0.001, "1ms"),
        (0.34, "340ms"),
        (0.9996, "1s"),
        (1, "1s"),
        (1.2, "1.2s"),
        (1.25, "1.2s"),
        (15, "15s"),
        (59.99, "1m"),
        (60, "1m"),
        (90, "1m30s"),
        (90.4, "1m30s"),
        (3600, "1h"),
        (7200, "2h"),
        (3661, "1h1m1s"),
        (86400, "1d"),
        (90000, "1d1h"),
        (-1.5, "-1.5s"),
        (-0.25, "-250ms"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_format_duration_non_finite():
    assert format_duration(math.inf) == "inf"


@pytest.mark.parametrize("seconds", [0.0005, 0.34, 1.2, 15, 90, 3661, 90000, 0])
def test_format_duration_round_trips(seconds):
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=0.05)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0B"),
        (512, "512B"),
        (1023, "1023B"),
        (1024, "1.0KiB"),
        (1536, "1.5KiB"),
        (64 * 1024, "64.0KiB"),
        (256 * 1024**2, "256.0MiB"),
        (1024**2 - 1, "1.0MiB"),  # rounds up into the next unit, not "1024.0KiB"
        (1024**3, "1.0GiB"),
        (3 * 1024**4, "3.0TiB"),
        (5 * 1024**5, "5.0PiB"),
        (2048 * 1024**5, "2048.0PiB"),
        (-2048, "-2.0KiB"),
    ],
)
def test_format_size(size, text):
    assert format_size(size) == text


@pytest.mark.parametrize("size", [512, 1536, 256 * 1024**2, 3 * 1024**3])
def test_format_size_round_trips(size):
    assert parse_size(format_size(size)) == size


# -- describe_value ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("four", '"four"'),
        ('say "hi"\n', '"say \\"hi\\"\\n"'),
        (True, "true"),
        (False, "false"),
        (4, "4"),
        (1.5, "1.5"),
        ([1, "a"], '[1, "a"]'),
        ({"a": 1}, "a table"),
        (dt.date(2024, 1, 2), "2024-01-02"),
        (None, "None"),
    ],
)
def test_describe_value(value, text):
    assert describe_value(value) == text
