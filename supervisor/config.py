"""Load and validate the supervisor's TOML configuration.

The whole file is checked up front, before anything forks or touches
Redis, so that a typo is reported once, as one line that names the file,
the key and what was expected (``etc/forq.toml: [queue 2].concurrency:
expected an integer >= 1, got "four"``), instead of surfacing later as a
traceback in a child process.  Unknown keys are errors at every level:
a misspelt ``lease_tll`` silently falling back to a default is exactly
the kind of mistake that only shows up in production.

Choices worth knowing (also in ``etc/forq.toml``):

* Durations and sizes use :mod:`forq.units` ("15s", "256MiB"); bare
  numbers are seconds / bytes.
* ``memory_limit = 0`` means no memory limit; ``address_space_factor = 0``
  disables the RLIMIT_AS backstop.
* Secrets never live in the TOML: a password inside ``[redis].url`` is
  refused; use ``password_file`` (relative paths are relative to the config
  file) or ``FORQ_REDIS_PASSWORD``.  ``FORQ_REDIS_URL`` and
  ``FORQ_REDIS_PASSWORD`` win when set to a non-empty value; when the
  password comes from the environment the file is not read.
* ``Config.job_policy(queue)`` for a queue this supervisor does not serve
  returns ``[defaults]`` plus task overrides (no queue overrides apply).
* ``imports`` are only checked to be module names here; they are imported
  by the supervisor, not by ``forq config check``.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import importlib.util
import json
import math
import os
import pwd
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import cronsim

from forq.defaults import JOB_POLICY
from forq.supervisor.tracing import TracingConfig
from forq.topology import as_cluster_url, is_topology_url, url_problem
from forq.units import UnitError, describe_value, parse_duration, parse_rate, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

__all__ = [
    "Config",
    "ConfigError",
    "QueueConfig",
    "PROTECTIONS",
    "SandboxConfig",
    "ScheduleConfig",
    "check_config_main",
    "load_config",
]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"

# Built-in per-job policy, in the units the rest of forq stores (ms, bytes).
BUILTIN_POLICY = JOB_POLICY  # forq.defaults: the one source of every job default

_TOP_KEYS = ("redis", "supervisor", "defaults", "queue", "tasks", "sandbox", "metrics", "schedule",
             "tracing")
_REDIS_KEYS = ("url", "password_file", "cluster", "min_replicas", "wait_timeout",
               "allow_eviction")
_SUPERVISOR_KEYS = (
    "name",
    "lease_ttl",
    "reaper_interval",
    "drain_timeout",
    "imports",
    "memory_sample_interval",
    "address_space_factor",
    "log_format",
    "fork_server",
    "job_cgroups",
)
_POLICY_KEYS = (
    "timeout",
    "memory_limit",
    "max_attempts",
    "max_crashes",
    "result_ttl",
    "idempotency_ttl",
    "max_result_bytes",
    "backoff",
)
_BACKOFF_KEYS = ("base", "factor", "max", "jitter")
_QUEUE_KEYS = ("name", "concurrency", "priority", "nice", "rate_limit", "max_in_flight",
               "network")
_SANDBOX_KEYS = ("run_as", "env_allow", "max_open_files", "namespaces", "network",
                 "private_tmp", "tmp_size", "max_processes", "max_output_bytes", "require",
                 "tasks")
_NETWORKS = ("host", "none")
# what `[sandbox].require` may name (supervisor/protections.py says which are on)
PROTECTIONS = ("run_as", "scrubbed_env", "private_config", "namespaces", "network", "private_tmp",
               "max_processes", "job_cgroups")
_METRICS_KEYS = ("listen",)
_TRACING_KEYS = ("enabled", "setup")
_SETUP_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
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
_LOG_FORMATS = ("text", "json")
_JOB_CGROUPS = ("auto", "required", "off")

# Names end up inside Redis keys ("forq:{emails}:pending") and process
# titles, so keep them to characters that need no quoting anywhere.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]*")
_QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")

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


class ConfigError(Exception):
    """The configuration cannot be used; ``str()`` is one line for the user.

    Raised for everything a user can get wrong (missing file, TOML syntax,
    unknown key, wrong type, bad value), never for forq's own bugs, so the
    CLI can print it without a traceback and exit 2.
    """


class _Invalid(Exception):
    """A problem found inside the document; the loader prefixes the file name."""


# --------------------------------------------------------------------------
# Public data


@dataclass(frozen=True)
class QueueConfig:
    """One ``[[queue]]`` this supervisor serves."""

    name: str
    concurrency: int
    priority: int = 0
    nice: int = 10
    rate_limit: tuple[float, float] | None = None
    max_in_flight: int | None = None
    network: str | None = None  # "none" or "host"; None: [sandbox].network


@dataclass(frozen=True)
class SandboxConfig:
    """Restrictions applied in each child before the handler runs.

    Every field is optional: ``run_as=None`` keeps the supervisor's user,
    ``env_allow=None`` keeps the whole environment (a list keeps only those
    variables), ``max_open_files=None`` keeps the inherited RLIMIT_NOFILE.
    """

    run_as: str | None = None
    env_allow: tuple[str, ...] | None = None
    max_open_files: int | None = None
    namespaces: bool = False  # PID, mount and IPC namespaces per job (fork/namespaces.py)
    network: str = "host"  # "none": each job in a network namespace with only loopback
    private_tmp: bool = False  # a size-capped tmpfs per job on /tmp and /dev/shm
    tmp_size: int = 64 << 20
    max_processes: int = 256  # per job
    max_output_bytes: int = 1 << 20  # stdout + stderr logged per job; the rest dropped
    require: tuple[str, ...] = ()  # protections the supervisor refuses to start without
    # [sandbox.tasks."name"] network = "none" | "host": per task, over the queue's
    task_network: dict[str, str] = field(default_factory=dict)


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


@dataclass(frozen=True)
class Config:
    """A validated supervisor configuration.

    Durations are float seconds; per-job policy is exposed through
    :meth:`job_policy` in the integer milliseconds/bytes the job records use.
    """

    path: str
    redis_url: str
    redis_password: str | None
    name: str
    lease_ttl: float
    reaper_interval: float
    drain_timeout: float
    imports: list[str]
    memory_sample_interval: float
    address_space_factor: float
    log_format: str
    queues: list[QueueConfig]
    sandbox: SandboxConfig
    metrics_listen: tuple[str, int] | None
    schedules: list[ScheduleConfig]
    defaults: dict[str, int | float] = field(repr=False)
    queue_overrides: dict[str, dict[str, int | float]] = field(repr=False)
    task_overrides: dict[str, dict[str, int | float]] = field(repr=False)
    # [redis].min_replicas / wait_timeout: WAIT for replicas after every report batch
    redis_min_replicas: int = 0
    redis_wait_timeout: float = 1.0
    # fork job children from a lean fork server (supervisor/fork/server.py), not from here
    fork_server: bool = True
    # per-job cgroup v2 memory limits (supervisor/cgroups.py): auto | required | off
    job_cgroups: str = "auto"
    # OpenTelemetry job spans (supervisor/tracing.py)
    tracing: TracingConfig = TracingConfig()
    # where redis_url came from, said at start-up: an environment variable that silently
    # overrides the file's URL surprises people ("--redis" is set by `forq run --redis`)
    redis_url_source: str = ""
    # [redis].allow_eviction: run on a Redis whose maxmemory-policy may delete keys
    redis_allow_eviction: bool = False
    redis_password_file: str | None = None  # resolved; jobs must not read it

    def queue(self, name: str) -> QueueConfig:
        """Return the served queue called ``name`` (KeyError if not served here)."""
        for queue in self.queues:
            if queue.name == name:
                return queue
        raise KeyError(name)

    def job_policy(self, queue_name: str) -> dict[str, Any]:
        """Return the effective job policy for ``queue_name``.

        Precedence is built-in < ``[defaults]`` < the queue's overrides < a
        task's overrides (``[tasks."name"]``), key by key, so a task that
        only sets ``timeout`` still inherits the queue's ``memory_limit``.
        Shape: ``{"defaults": {...}, "tasks": {task: {...}}}``; fresh dicts
        each call, safe to mutate or serialise.
        """
        base = {**self.defaults, **self.queue_overrides.get(queue_name, {})}
        return {
            "defaults": dict(base),
            "tasks": {task: {**base, **over} for task, over in self.task_overrides.items()},
        }


# --------------------------------------------------------------------------
# Field readers.  Each takes the value and its location ("where") and
# raises _Invalid with "where: expected ..., got ..." on a bad value.


def _key(name: str) -> str:
    return name if _BARE_KEY_RE.fullmatch(name) else json.dumps(name, ensure_ascii=False)


def _fork_server(value: object) -> bool:
    if not isinstance(value, bool):
        raise _expected("[supervisor].fork_server", "true or false", value)
    return value


def _expected(where: str, what: str, value: object) -> _Invalid:
    return _Invalid(f"{where}: expected {what}, got {describe_value(value)}")


def _check_keys(table: Mapping[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    """Refuse keys we do not know, suggesting the closest one we do."""
    for key in table:
        if key in allowed:
            continue
        where = f"{prefix}.{_key(key)}" if prefix else _key(key)
        if not prefix and isinstance(table[key], (dict, list)):
            where = f"[{_key(key)}]"
        message = f"unknown key {where}"
        close = difflib.get_close_matches(key, allowed, n=1)
        if close:
            message += f" (did you mean {close[0]}?)"
        raise _Invalid(message)


def _table(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _expected(where, "a table", value)
    return value


def _int(value: object, where: str, minimum: int | None = None, maximum: int | None = None) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool)
    if ok and minimum is not None and value < minimum:  # type: ignore[operator]
        ok = False
    if ok and maximum is not None and value > maximum:  # type: ignore[operator]
        ok = False
    if not ok:
        if minimum is not None and maximum is not None:
            what = f"an integer from {minimum} to {maximum}"
        elif minimum is not None:
            what = f"an integer >= {minimum}"
        else:
            what = "an integer"
        raise _expected(where, what, value)
    return value  # type: ignore[return-value]


def _number(
    value: object, where: str, what: str, minimum: float, maximum: float = math.inf
) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not minimum <= value <= maximum
    ):
        raise _expected(where, what, value)
    return float(value)


def _str(value: object, where: str, what: str = "a string") -> str:
    if not isinstance(value, str) or not value.strip():
        raise _expected(where, what, value)
    return value


def _choice(value: object, where: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _expected(where, "one of " + ", ".join(f'"{c}"' for c in choices), value)
    return str(value)


def _name(value: object, where: str, pattern: re.Pattern[str] = _NAME_RE) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise _expected(where, "a name of letters, digits, '_', '.' or '-'", value)
    return value


def _duration(value: object, where: str, *, positive: bool = False) -> float:
    try:
        seconds = parse_duration(value, where=where)
    except UnitError as exc:
        raise _Invalid(str(exc)) from None
    if positive and seconds <= 0:
        raise _expected(where, 'a duration > 0 such as "250ms", "15s" or "5m"', value)
    return seconds


def _ms(value: object, where: str, *, positive: bool = False) -> int:
    return int(round(_duration(value, where, positive=positive) * 1000))


def _size(value: object, where: str, *, minimum: int = 0) -> int:
    try:
        size = parse_size(value, where=where)
    except UnitError as exc:
        raise _Invalid(str(exc)) from None
    if size < minimum:
        raise _expected(
            where, f'a size of at least {minimum} byte such as "64KiB" or "1MiB"', value
        )
    return size


def _rate(value: object, where: str) -> tuple[float, float]:
    try:
        return parse_rate(value, where=where)
    except UnitError as exc:
        raise _Invalid(str(exc)) from None


def _string_list(value: object, where: str, what: str) -> list[str]:
    if not isinstance(value, list):
        raise _expected(where, f"a list of {what}", value)
    for index, item in enumerate(value):
        _str(item, f"{where}[{index}]", what)
    return list(value)


# --------------------------------------------------------------------------
# Sections


def _policy_overrides(table: Mapping[str, Any], prefix: str) -> dict[str, int | float]:
    """Read the per-job policy keys present in ``table`` (only those present)."""
    out: dict[str, int | float] = {}
    if "timeout" in table:
        out["timeout_ms"] = _ms(table["timeout"], f"{prefix}.timeout", positive=True)
    if "memory_limit" in table:
        out["memory_limit"] = _size(table["memory_limit"], f"{prefix}.memory_limit")
    if "max_attempts" in table:
        out["max_attempts"] = _int(table["max_attempts"], f"{prefix}.max_attempts", 1)
    if "max_crashes" in table:
        out["max_crashes"] = _int(table["max_crashes"], f"{prefix}.max_crashes", 0)
    if "result_ttl" in table:
        out["result_ttl_ms"] = _ms(table["result_ttl"], f"{prefix}.result_ttl")
    if "idempotency_ttl" in table:
        out["idempotency_ttl_ms"] = _ms(
            table["idempotency_ttl"], f"{prefix}.idempotency_ttl", positive=True
        )
    if "max_result_bytes" in table:
        out["max_result_bytes"] = _size(
            table["max_result_bytes"], f"{prefix}.max_result_bytes", minimum=1
        )
    if "backoff" in table:
        where = f"{prefix}.backoff"
        backoff = _table(table["backoff"], where)
        _check_keys(backoff, _BACKOFF_KEYS, where)
        if "base" in backoff:
            out["backoff_base_ms"] = _ms(backoff["base"], f"{where}.base")
        if "factor" in backoff:
            out["backoff_factor"] = _number(
                backoff["factor"], f"{where}.factor", "a number >= 1.0", 1.0
            )
        if "max" in backoff:
            out["backoff_max_ms"] = _ms(backoff["max"], f"{where}.max")
        if "jitter" in backoff:
            out["backoff_jitter"] = _number(
                backoff["jitter"], f"{where}.jitter", "a number from 0.0 to 1.0", 0.0, 1.0
            )
    return out


def _check_policy(policy: Mapping[str, int | float], where: str) -> None:
    """Checks that span keys, made on the merged policy since levels mix."""
    if policy["backoff_max_ms"] < policy["backoff_base_ms"]:
        raise _Invalid(
            f"{where}: backoff.max ({policy['backoff_max_ms']}ms) is less than "
            f"backoff.base ({policy['backoff_base_ms']}ms)"
        )


def _redis(
    doc: Mapping[str, Any], env: Mapping[str, str], base_dir: Path
) -> tuple[str, str | None]:
    table = _table(doc.get("redis", {}), "[redis]")
    _check_keys(table, _REDIS_KEYS, "[redis]")
    url = _str(
        table.get("url", DEFAULT_REDIS_URL), "[redis].url", "a redis://, rediss:// or unix:// URL"
    )
    _check_redis_url(url, "[redis].url")
    if urlsplit(url).password:
        raise _Invalid(
            "[redis].url: contains a password; secrets do not belong in this file, "
            "use [redis].password_file or FORQ_REDIS_PASSWORD"
        )
    if env.get("FORQ_REDIS_URL"):
        url = env["FORQ_REDIS_URL"]
        _check_redis_url(url, "FORQ_REDIS_URL")
    cluster = table.get("cluster", False)
    if not isinstance(cluster, bool):
        raise _expected("[redis].cluster", "true or false", cluster)
    if cluster:
        url = as_cluster_url(url)  # any node's redis:// URL → redis+cluster://
        if "+cluster://" not in url:
            raise _Invalid("[redis].cluster: true needs a redis:// or redis+cluster:// URL, "
                           f"got {_redact(url)}")

    password_file = table.get("password_file")
    if password_file is not None:
        _str(password_file, "[redis].password_file", "a file path")
    if env.get("FORQ_REDIS_PASSWORD"):
        return url, env["FORQ_REDIS_PASSWORD"]
    if password_file is None:
        return url, None
    file_path = base_dir / os.path.expanduser(password_file)
    try:
        password = file_path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise _Invalid(f"[redis].password_file: missing file {file_path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _Invalid(f"[redis].password_file: cannot read {file_path}: {reason}") from None
    if not password:
        raise _Invalid(f"[redis].password_file: {file_path} is empty")
    return url, password


def _url_source(doc: Mapping[str, Any], shown: str, env: Mapping[str, str]) -> str:
    if env.get("FORQ_REDIS_URL"):
        return "FORQ_REDIS_URL"
    if "url" in doc.get("redis", {}):
        return f"[redis].url in {shown}"
    return f"the default: no [redis].url in {shown}"
def _password_file(doc: Mapping[str, Any], base_dir: Path) -> str | None:
    name = doc.get("redis", {}).get("password_file")
    return str(base_dir / os.path.expanduser(name)) if isinstance(name, str) else None


def _replication(doc: Mapping[str, Any]) -> dict[str, Any]:
    """[redis].min_replicas (WAIT for that many replicas after each report batch) and
    [redis].wait_timeout (how long, at most)."""
    table = doc.get("redis", {})
    out: dict[str, Any] = {}
    if "allow_eviction" in table:
        if not isinstance(table["allow_eviction"], bool):
            raise _expected("[redis].allow_eviction", "true or false", table["allow_eviction"])
        out["redis_allow_eviction"] = table["allow_eviction"]
    if "min_replicas" in table:
        out["redis_min_replicas"] = _int(table["min_replicas"], "[redis].min_replicas", 0, 16)
    if "wait_timeout" in table:
        out["redis_wait_timeout"] = _duration(table["wait_timeout"], "[redis].wait_timeout",
                                              positive=True)
    return out


def check_redis_url(url: str, where: str) -> None:
    """ConfigError naming `where` unless `url` is a Redis URL forq can use."""
    try:
        _check_redis_url(url, where)
    except _Invalid as exc:
        raise ConfigError(str(exc)) from None


def _check_redis_url(url: str, where: str) -> None:
    shown = _redact(url)
    what = 'a URL such as "redis://127.0.0.1:6379/0", rediss:// or unix://'
    if is_topology_url(url):  # redis+cluster:// or redis+sentinel:// (jobs/topology.py)
        problem = url_problem(url)
        if problem:
            raise _expected(where, problem, shown)
        return
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. a malformed IPv6 host
        raise _expected(where, what, shown) from None
    ok = parts.scheme in ("redis", "rediss") and bool(parts.hostname)
    ok = ok or (parts.scheme == "unix" and bool(parts.path))
    if not ok:
        raise _expected(where, what, shown)
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise _expected(where, "a URL with a port from 0 to 65535", shown) from None


def _redact(url: str) -> str:
    """Hide a password in a URL we are about to print in an error."""
    head, at, host = url.rpartition("@")
    if not at or ":" not in head.partition("//")[2]:
        return url
    scheme, slashes, user = head.rpartition("//")
    return f"{scheme}{slashes}{user.partition(':')[0]}:***@{host}"


def _listen(value: object, where: str) -> tuple[str, int] | None:
    if value == "":
        return None
    what = 'host:port such as "127.0.0.1:9464" (or "" for off)'
    if not isinstance(value, str):
        raise _expected(where, what, value)
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise _expected(where, what, value)
    return host, int(port)


def _queues(doc: Mapping[str, Any]) -> tuple[list[QueueConfig], dict[str, dict[str, int | float]]]:
    raw = doc.get("queue")
    if raw is None:
        raise _Invalid("no queues: add at least one [[queue]] with name and concurrency")
    if not isinstance(raw, list):
        raise _expected("queue", "an array of tables written [[queue]]", raw)
    if not raw:
        raise _Invalid("no queues: add at least one [[queue]] with name and concurrency")
    queues: list[QueueConfig] = []
    overrides: dict[str, dict[str, int | float]] = {}
    for index, item in enumerate(raw, start=1):
        prefix = f"[queue {index}]"
        table = _table(item, prefix)
        _check_keys(table, _QUEUE_KEYS + _POLICY_KEYS, prefix)
        for required in ("name", "concurrency"):
            if required not in table:
                raise _Invalid(f"{prefix}: missing required key {required}")
        name = _name(table["name"], f"{prefix}.name", _QUEUE_NAME_RE)
        if name in overrides:
            raise _Invalid(f'{prefix}.name: duplicate queue "{name}"')
        rate_limit = table.get("rate_limit")
        max_in_flight = table.get("max_in_flight")
        queues.append(
            QueueConfig(
                name=name,
                concurrency=_int(table["concurrency"], f"{prefix}.concurrency", 1),
                priority=_int(table.get("priority", 0), f"{prefix}.priority"),
                nice=_int(table.get("nice", 10), f"{prefix}.nice", 0, 19),
                rate_limit=None
                if rate_limit is None
                else _rate(rate_limit, f"{prefix}.rate_limit"),
                max_in_flight=(
                    None
                    if max_in_flight is None
                    else _int(max_in_flight, f"{prefix}.max_in_flight", 1)
                ),
                network=(None if "network" not in table
                         else _choice(table["network"], f"{prefix}.network", _NETWORKS)),
            )
        )
        overrides[name] = _policy_overrides(table, prefix)
    # Stable sort: queues of equal priority keep their order in the file.
    queues.sort(key=lambda q: -q.priority)
    return queues, overrides


def _tasks(doc: Mapping[str, Any]) -> dict[str, dict[str, int | float]]:
    tasks = _table(doc.get("tasks", {}), "[tasks]")
    out: dict[str, dict[str, int | float]] = {}
    for task, value in tasks.items():
        prefix = f"[tasks.{json.dumps(task, ensure_ascii=False)}]"
        table = _table(value, prefix)
        _check_keys(table, _POLICY_KEYS, prefix)
        out[task] = _policy_overrides(table, prefix)
    return out


def _sandbox(doc: Mapping[str, Any]) -> SandboxConfig:
    table = _table(doc.get("sandbox", {}), "[sandbox]")
    _check_keys(table, _SANDBOX_KEYS, "[sandbox]")
    run_as = table.get("run_as")
    if run_as is not None:
        _str(run_as, "[sandbox].run_as", "a user name")
        try:
            pwd.getpwnam(run_as)
        except KeyError:
            raise _Invalid(f'[sandbox].run_as: no such user "{run_as}" on this machine') from None
    env_allow = table.get("env_allow")
    if env_allow is not None:
        env_allow = tuple(
            _string_list(env_allow, "[sandbox].env_allow", "environment variable names")
        )
    max_open_files = table.get("max_open_files")
    if max_open_files is not None:
        max_open_files = _int(max_open_files, "[sandbox].max_open_files", 16)
    flags = {}
    for key in ("namespaces", "private_tmp"):
        flags[key] = table.get(key, False)
        if not isinstance(flags[key], bool):
            raise _expected(f"[sandbox].{key}", "true or false", flags[key])
    require = tuple(_string_list(table.get("require", []), "[sandbox].require",
                                 "protection names"))
    for name in require:
        if name not in PROTECTIONS:
            raise _Invalid(f"[sandbox].require: unknown protection {json.dumps(name)}; "
                           f"expected some of {', '.join(PROTECTIONS)}")
    task_network = {}
    for task, value in _table(table.get("tasks", {}), "[sandbox.tasks]").items():
        where = f"[sandbox.tasks.{json.dumps(task, ensure_ascii=False)}]"
        options = _table(value, where)
        _check_keys(options, ("network",), where)
        if "network" in options:
            task_network[task] = _choice(options["network"], f"{where}.network", _NETWORKS)
    return SandboxConfig(
        run_as=run_as, env_allow=env_allow, max_open_files=max_open_files,
        task_network=task_network,
        network=_choice(table.get("network", "host"), "[sandbox].network", _NETWORKS),
        tmp_size=_size(table.get("tmp_size", "64MiB"), "[sandbox].tmp_size", minimum=1 << 20),
        max_processes=_int(table.get("max_processes", 256), "[sandbox].max_processes", 0),
        max_output_bytes=_size(table.get("max_output_bytes", "1MiB"),
                               "[sandbox].max_output_bytes"),
        require=require, **flags)


def _schedules(doc: Mapping[str, Any]) -> list[ScheduleConfig]:
    raw = doc.get("schedule", [])
    if not isinstance(raw, list):
        raise _expected("schedule", "an array of tables written [[schedule]]", raw)
    schedules: list[ScheduleConfig] = []
    seen: set[str] = set()
    for index, item in enumerate(raw, start=1):
        prefix = f"[schedule {index}]"
        table = _table(item, prefix)
        if isinstance(table.get("name"), str) and table["name"]:
            prefix = f"[schedule {json.dumps(table['name'], ensure_ascii=False)}]"
        _check_keys(table, _SCHEDULE_KEYS, prefix)
        for required in ("name", "cron", "queue", "task"):
            if required not in table:
                raise _Invalid(f"{prefix}: missing required key {required}")
        name = _name(table["name"], f"{prefix}.name")
        if name in seen:
            raise _Invalid(f'{prefix}.name: duplicate schedule "{name}"')
        seen.add(name)
        timezone = _str(
            table.get("timezone", "UTC"), f"{prefix}.timezone", 'an IANA time zone such as "UTC"'
        )
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise _expected(
                f"{prefix}.timezone", 'an IANA time zone such as "UTC" or "Europe/Paris"', timezone
            ) from None
        cron = _str(table["cron"], f"{prefix}.cron", 'a cron expression such as "0 3 * * *"')
        every = _cron(cron, timezone, f"{prefix}.cron")
        args = table.get("args", [])
        if not isinstance(args, list):
            raise _expected(f"{prefix}.args", "a list", args)
        kwargs = table.get("kwargs", {})
        if not isinstance(kwargs, dict):
            raise _expected(f"{prefix}.kwargs", "a table", kwargs)
        for key, value in (("args", args), ("kwargs", kwargs)):
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError):
                raise _Invalid(
                    f"{prefix}.{key}: must be JSON values (TOML dates, times, inf and nan are not)"
                ) from None
        schedules.append(
            ScheduleConfig(
                name=name,
                cron=cron,
                queue=_name(table["queue"], f"{prefix}.queue", _QUEUE_NAME_RE),
                task=_str(table["task"], f"{prefix}.task", "a task name"),
                timezone=timezone,
                args=args,
                kwargs=kwargs,
                catch_up=_choice(table.get("catch_up", "latest"), f"{prefix}.catch_up", _CATCH_UP),
                max_catch_up=_int(table.get("max_catch_up", 100), f"{prefix}.max_catch_up", 1),
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
            raise _expected(where, '"@every <duration>" such as "@every 30s"', cron)
        return _duration(rest, where, positive=True)
    if text.startswith("@"):
        expression = _CRON_MACROS.get(text.lower())
        if expression is None:
            macros = ", ".join(sorted(_CRON_MACROS))
            raise _expected(where, f"one of {macros} or @every <duration>", cron)
        return None
    if len(text.split()) != 5:
        raise _expected(where, 'a 5-field cron expression such as "0 3 * * *"', cron)
    try:
        next(cronsim.CronSim(text, _dt.datetime.now(ZoneInfo(timezone))))
    except cronsim.CronSimError as exc:
        raise _expected(where, f"a valid cron expression ({exc})", cron) from None
    except StopIteration:
        raise _Invalid(f"{where}: {describe_value(cron)} never fires") from None
    return None


# --------------------------------------------------------------------------
# Entry points


def _read(path: Path, shown: str) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"missing file {shown}") from None
    except IsADirectoryError:
        raise ConfigError(f"{shown}: is a directory, expected a TOML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {shown}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{shown}: not UTF-8 text (byte {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{shown}: invalid TOML: {exc}") from None


def load_config(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Config:
    """Read, validate and resolve the supervisor config at ``path``.

    ``env`` defaults to ``os.environ`` (for FORQ_REDIS_URL and
    FORQ_REDIS_PASSWORD); tests pass a dict instead.  Raises
    :class:`ConfigError` with a one-line message on any problem.
    """
    shown = os.fspath(path)
    file_path = Path(shown)
    doc = _read(file_path, shown)
    env = os.environ if env is None else env
    try:
        return _build(doc, shown, env, file_path.parent)
    except _Invalid as exc:
        raise ConfigError(f"{shown}: {exc}") from None


def _build(doc: dict[str, Any], shown: str, env: Mapping[str, str], base_dir: Path) -> Config:
    _check_keys(doc, _TOP_KEYS, "")
    redis_url, redis_password = _redis(doc, env, base_dir)

    sup = _table(doc.get("supervisor", {}), "[supervisor]")
    _check_keys(sup, _SUPERVISOR_KEYS, "[supervisor]")
    if "name" in sup:
        name = _name(sup["name"], "[supervisor].name")
    else:
        name = f"{socket.gethostname()}:{os.getpid()}"
    factor = _number(
        sup.get("address_space_factor", 4.0),
        "[supervisor].address_space_factor",
        "0 (off) or a number >= 1",
        0.0,
    )
    if 0 < factor < 1:
        raise _expected("[supervisor].address_space_factor", "0 (off) or a number >= 1", factor)

    defaults_table = _table(doc.get("defaults", {}), "[defaults]")
    _check_keys(defaults_table, _POLICY_KEYS, "[defaults]")
    defaults = {**BUILTIN_POLICY, **_policy_overrides(defaults_table, "[defaults]")}
    _check_policy(defaults, "[defaults]")

    queues, queue_overrides = _queues(doc)
    task_overrides = _tasks(doc)
    config = Config(
        path=shown,
        redis_url=redis_url,
        redis_password=redis_password,
        name=name,
        lease_ttl=_duration(sup.get("lease_ttl", "15s"), "[supervisor].lease_ttl", positive=True),
        reaper_interval=_duration(
            sup.get("reaper_interval", "1s"), "[supervisor].reaper_interval", positive=True
        ),
        drain_timeout=_duration(sup.get("drain_timeout", "60s"), "[supervisor].drain_timeout"),
        imports=[
            _name(module, f"[supervisor].imports[{i}]", _MODULE_RE)
            for i, module in enumerate(
                _string_list(sup.get("imports", []), "[supervisor].imports", "module names")
            )
        ],
        memory_sample_interval=_duration(
            sup.get("memory_sample_interval", "50ms"),
            "[supervisor].memory_sample_interval",
            positive=True,
        ),
        address_space_factor=factor,
        log_format=_choice(sup.get("log_format", "text"), "[supervisor].log_format", _LOG_FORMATS),
        queues=queues,
        sandbox=_sandbox(doc),
        metrics_listen=_metrics(doc),
        schedules=_schedules(doc),
        defaults=defaults,
        queue_overrides=queue_overrides,
        task_overrides=task_overrides,
        fork_server=_fork_server(sup.get("fork_server", True)),
        job_cgroups=_choice(sup.get("job_cgroups", "auto"), "[supervisor].job_cgroups",
                            _JOB_CGROUPS),
        tracing=_tracing(doc),
        redis_url_source=_url_source(doc, shown, env),
        redis_password_file=_password_file(doc, base_dir),
        **_replication(doc),
    )
    # job_policy() of a queue not served here is [defaults] + task overrides.
    for queue_name in [None, *(q.name for q in queues)]:
        policy = config.job_policy(queue_name or "")
        on_queue = f' on queue "{queue_name}"' if queue_name else ""
        if queue_name:
            _check_policy(policy["defaults"], f'[queue "{queue_name}"]')
        for task, task_policy in policy["tasks"].items():
            _check_policy(task_policy, f"[tasks.{json.dumps(task)}]{on_queue}")
    return config


def _metrics(doc: Mapping[str, Any]) -> tuple[str, int] | None:
    table = _table(doc.get("metrics", {}), "[metrics]")
    _check_keys(table, _METRICS_KEYS, "[metrics]")
    return _listen(table.get("listen", DEFAULT_METRICS_LISTEN), "[metrics].listen")


def _tracing(doc: Mapping[str, Any]) -> TracingConfig:
    table = _table(doc.get("tracing", {}), "[tracing]")
    _check_keys(table, _TRACING_KEYS, "[tracing]")
    enabled = table.get("enabled", False)
    if not isinstance(enabled, bool):
        raise _expected("[tracing].enabled", "true or false", enabled)
    setup = table.get("setup", "")
    if setup != "" and not (isinstance(setup, str) and _SETUP_RE.fullmatch(setup)):
        raise _expected("[tracing].setup", '"module:function"', setup)
    if enabled and importlib.util.find_spec("opentelemetry") is None:
        raise _Invalid("[tracing].enabled: OpenTelemetry is not installed "
                       "(pip install 'forq[otel]')")
    return TracingConfig(enabled, setup)


def check_config_main(path: str) -> int:
    """``forq config check PATH``: 0 and an ``ok:`` line, or 2 and the error on stderr."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"ok: {path} ({len(config.queues)} queues, {len(config.schedules)} schedules)")
    return 0
