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

The tables with most to say have modules of their own: `config_redis` ([redis]),
`config_sandbox` ([sandbox]), `config_schedules` ([[schedule]]); `config_fields` reads
one value of any kind and words the error.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forq.channel import MAX_THROTTLE_MS
from forq.defaults import JOB_POLICY
from forq.supervisor.config import fields as read
from forq.supervisor.config import redis_table as config_redis
from forq.supervisor.config.sandbox import NETWORKS, PROTECTIONS, SandboxConfig, read_sandbox
from forq.supervisor.config.schedules import ScheduleConfig, read_schedules
from forq.supervisor.observe.tracing import TracingConfig

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

DEFAULT_REDIS_URL = config_redis.DEFAULT_REDIS_URL
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"
# [[queue]].max_throttle: the longest a handler's `current().throttle(...)` pauses its
# queue or group (a longer request is cut to this); 0 lets no handler pause anything
DEFAULT_MAX_THROTTLE = 600.0
MAX_THROTTLE = MAX_THROTTLE_MS / 1000  # what the channel carries at most (24 h)

# Built-in per-job policy, in the units the rest of forq stores (ms, bytes).
BUILTIN_POLICY = JOB_POLICY  # forq.defaults: the one source of every job default

_TOP_KEYS = ("redis", "supervisor", "defaults", "queue", "tasks", "sandbox", "metrics", "schedule",
             "tracing")
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
    "max_snoozes",
    "result_ttl",
    "idempotency_ttl",
    "max_result_bytes",
    "backoff",
)
_BACKOFF_KEYS = ("base", "factor", "max", "jitter")
MAX_PREFETCH = 1000  # leases held ahead of free slots, per queue
_QUEUE_KEYS = ("name", "concurrency", "priority", "nice", "rate_limit", "max_in_flight",
               "network", "paused", "group_concurrency", "group_rate_limit", "prefetch",
               "max_throttle")
_METRICS_KEYS = ("listen",)
_TRACING_KEYS = ("enabled", "setup")
_SETUP_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
_LOG_FORMATS = ("text", "json")
_JOB_CGROUPS = ("auto", "required", "off")


class ConfigError(Exception):
    """The configuration cannot be used; ``str()`` is one line for the user.

    Raised for everything a user can get wrong (missing file, TOML syntax,
    unknown key, wrong type, bad value), never for forq's own bugs, so the
    CLI can print it without a traceback and exit 2.
    """


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
    # per group (jobs enqueued with group=), stored in Redis like the two above
    group_concurrency: int | None = None
    group_rate_limit: tuple[float, float] | None = None
    network: str | None = None  # "none" or "host"; None: [sandbox].network
    # paused = true: this supervisor pauses the queue (Queue.pause) when it starts and
    # reloads; false never resumes one (an operator's `forq pause` outlives restarts)
    paused: bool = False
    # jobs leased ahead of a free slot (see `supervisor/leases/held.py`): a slot starts its next
    # job the moment its child ends, without waiting for a claim's round trip
    prefetch: int = 0
    # the longest pause a handler's `current().throttle` may put on this queue or one of
    # its groups, in seconds (a longer request is cut to this; 0: throttles pause nothing)
    max_throttle: float = DEFAULT_MAX_THROTTLE


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
    # per-job cgroup v2 memory limits (supervisor/isolation/cgroups.py): auto | required | off
    job_cgroups: str = "auto"
    # OpenTelemetry job spans (supervisor/observe/tracing.py)
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


def _paused(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise read.expected(where, "true or false", value)
    return value


def _fork_server(value: object) -> bool:
    if not isinstance(value, bool):
        raise read.expected("[supervisor].fork_server", "true or false", value)
    return value


def check_redis_url(url: str, where: str) -> None:
    """ConfigError naming `where` unless `url` is a Redis URL forq can use."""
    try:
        config_redis.check_url(url, where)
    except read.Invalid as exc:
        raise ConfigError(str(exc)) from None


# --------------------------------------------------------------------------
# Sections


def _policy_overrides(table: Mapping[str, Any], prefix: str) -> dict[str, int | float]:
    """Read the per-job policy keys present in ``table`` (only those present)."""
    out: dict[str, int | float] = {}
    if "timeout" in table:
        out["timeout_ms"] = read.ms(table["timeout"], f"{prefix}.timeout", positive=True)
    if "memory_limit" in table:
        out["memory_limit"] = read.size(table["memory_limit"], f"{prefix}.memory_limit")
    if "max_attempts" in table:
        out["max_attempts"] = read.integer(table["max_attempts"], f"{prefix}.max_attempts", 1)
    if "max_crashes" in table:
        out["max_crashes"] = read.integer(table["max_crashes"], f"{prefix}.max_crashes", 0)
    if "max_snoozes" in table:
        out["max_snoozes"] = read.integer(table["max_snoozes"], f"{prefix}.max_snoozes", 0)
    if "result_ttl" in table:
        out["result_ttl_ms"] = read.ms(table["result_ttl"], f"{prefix}.result_ttl")
    if "idempotency_ttl" in table:
        out["idempotency_ttl_ms"] = read.ms(
            table["idempotency_ttl"], f"{prefix}.idempotency_ttl", positive=True
        )
    if "max_result_bytes" in table:
        out["max_result_bytes"] = read.size(
            table["max_result_bytes"], f"{prefix}.max_result_bytes", minimum=1
        )
    if "backoff" in table:
        where = f"{prefix}.backoff"
        backoff = read.table(table["backoff"], where)
        read.check_keys(backoff, _BACKOFF_KEYS, where)
        if "base" in backoff:
            out["backoff_base_ms"] = read.ms(backoff["base"], f"{where}.base")
        if "factor" in backoff:
            out["backoff_factor"] = read.number(
                backoff["factor"], f"{where}.factor", "a number >= 1.0", 1.0
            )
        if "max" in backoff:
            out["backoff_max_ms"] = read.ms(backoff["max"], f"{where}.max")
        if "jitter" in backoff:
            out["backoff_jitter"] = read.number(
                backoff["jitter"], f"{where}.jitter", "a number from 0.0 to 1.0", 0.0, 1.0
            )
    return out


def _check_policy(policy: Mapping[str, int | float], where: str) -> None:
    """Checks that span keys, made on the merged policy since levels mix."""
    if policy["backoff_max_ms"] < policy["backoff_base_ms"]:
        raise read.Invalid(
            f"{where}: backoff.max ({policy['backoff_max_ms']}ms) is less than "
            f"backoff.base ({policy['backoff_base_ms']}ms)"
        )


def _max_throttle(value: object, where: str) -> float:
    seconds = read.duration(value, where)
    if seconds > MAX_THROTTLE:
        raise read.expected(where, 'a duration up to "24h" (0: throttles pause nothing)', value)
    return seconds


def _listen(value: object, where: str) -> tuple[str, int] | None:
    if value == "":
        return None
    what = 'host:port such as "127.0.0.1:9464" (or "" for off)'
    if not isinstance(value, str):
        raise read.expected(where, what, value)
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise read.expected(where, what, value)
    return host, int(port)


def _queues(doc: Mapping[str, Any]) -> tuple[list[QueueConfig], dict[str, dict[str, int | float]]]:
    raw = doc.get("queue")
    if raw is None:
        raise read.Invalid("no queues: add at least one [[queue]] with name and concurrency")
    if not isinstance(raw, list):
        raise read.expected("queue", "an array of tables written [[queue]]", raw)
    if not raw:
        raise read.Invalid("no queues: add at least one [[queue]] with name and concurrency")
    queues: list[QueueConfig] = []
    overrides: dict[str, dict[str, int | float]] = {}
    for index, item in enumerate(raw, start=1):
        prefix = f"[queue {index}]"
        table = read.table(item, prefix)
        read.check_keys(table, _QUEUE_KEYS + _POLICY_KEYS, prefix)
        for required in ("name", "concurrency"):
            if required not in table:
                raise read.Invalid(f"{prefix}: missing required key {required}")
        name = read.simple_name(table["name"], f"{prefix}.name", read.QUEUE_NAME_RE)
        if name in overrides:
            raise read.Invalid(f'{prefix}.name: duplicate queue "{name}"')
        rate_limit = table.get("rate_limit")
        max_in_flight = table.get("max_in_flight")
        group_concurrency = table.get("group_concurrency")
        group_rate_limit = table.get("group_rate_limit")
        queues.append(
            QueueConfig(
                name=name,
                concurrency=read.integer(table["concurrency"], f"{prefix}.concurrency", 1),
                priority=read.integer(table.get("priority", 0), f"{prefix}.priority"),
                nice=read.integer(table.get("nice", 10), f"{prefix}.nice", 0, 19),
                rate_limit=None
                if rate_limit is None
                else read.rate(rate_limit, f"{prefix}.rate_limit"),
                max_in_flight=(
                    None
                    if max_in_flight is None
                    else read.integer(max_in_flight, f"{prefix}.max_in_flight", 1)
                ),
                group_concurrency=(
                    None
                    if group_concurrency is None
                    else read.integer(group_concurrency, f"{prefix}.group_concurrency", 1)
                ),
                group_rate_limit=(
                    None
                    if group_rate_limit is None
                    else read.rate(group_rate_limit, f"{prefix}.group_rate_limit")
                ),
                network=(None if "network" not in table
                         else read.choice(table["network"], f"{prefix}.network", NETWORKS)),
                paused=_paused(table.get("paused", False), f"{prefix}.paused"),
                prefetch=read.integer(table.get("prefetch", 0), f"{prefix}.prefetch", 0,
                                      MAX_PREFETCH),
                max_throttle=_max_throttle(table.get("max_throttle", DEFAULT_MAX_THROTTLE),
                                           f"{prefix}.max_throttle"),
            )
        )
        overrides[name] = _policy_overrides(table, prefix)
    # Stable sort: queues of equal priority keep their order in the file.
    queues.sort(key=lambda q: -q.priority)
    return queues, overrides


def _tasks(doc: Mapping[str, Any]) -> dict[str, dict[str, int | float]]:
    tasks = read.table(doc.get("tasks", {}), "[tasks]")
    out: dict[str, dict[str, int | float]] = {}
    for task, value in tasks.items():
        prefix = f"[tasks.{json.dumps(task, ensure_ascii=False)}]"
        table = read.table(value, prefix)
        read.check_keys(table, _POLICY_KEYS, prefix)
        out[task] = _policy_overrides(table, prefix)
    return out


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
    except read.Invalid as exc:
        raise ConfigError(f"{shown}: {exc}") from None


def _build(doc: dict[str, Any], shown: str, env: Mapping[str, str], base_dir: Path) -> Config:
    read.check_keys(doc, _TOP_KEYS, "")
    redis_url, redis_password = config_redis.read_redis(doc, env, base_dir)

    sup = read.table(doc.get("supervisor", {}), "[supervisor]")
    read.check_keys(sup, _SUPERVISOR_KEYS, "[supervisor]")
    if "name" in sup:
        name = read.simple_name(sup["name"], "[supervisor].name")
    else:
        name = f"{socket.gethostname()}:{os.getpid()}"
    factor = read.number(
        sup.get("address_space_factor", 4.0),
        "[supervisor].address_space_factor",
        "0 (off) or a number >= 1",
        0.0,
    )
    if 0 < factor < 1:
        raise read.expected("[supervisor].address_space_factor", "0 (off) or a number >= 1", factor)

    defaults_table = read.table(doc.get("defaults", {}), "[defaults]")
    read.check_keys(defaults_table, _POLICY_KEYS, "[defaults]")
    defaults = {**BUILTIN_POLICY, **_policy_overrides(defaults_table, "[defaults]")}
    _check_policy(defaults, "[defaults]")

    queues, queue_overrides = _queues(doc)
    task_overrides = _tasks(doc)
    config = Config(
        path=shown,
        redis_url=redis_url,
        redis_password=redis_password,
        name=name,
        lease_ttl=read.duration(sup.get("lease_ttl", "15s"), "[supervisor].lease_ttl", positive=True),
        reaper_interval=read.duration(
            sup.get("reaper_interval", "1s"), "[supervisor].reaper_interval", positive=True
        ),
        drain_timeout=read.duration(sup.get("drain_timeout", "60s"), "[supervisor].drain_timeout"),
        imports=[
            read.simple_name(module, f"[supervisor].imports[{i}]", read.MODULE_RE)
            for i, module in enumerate(
                read.string_list(sup.get("imports", []), "[supervisor].imports", "module names")
            )
        ],
        memory_sample_interval=read.duration(
            sup.get("memory_sample_interval", "50ms"),
            "[supervisor].memory_sample_interval",
            positive=True,
        ),
        address_space_factor=factor,
        log_format=read.choice(sup.get("log_format", "text"), "[supervisor].log_format", _LOG_FORMATS),
        queues=queues,
        sandbox=read_sandbox(doc),
        metrics_listen=_metrics(doc),
        schedules=read_schedules(doc),
        defaults=defaults,
        queue_overrides=queue_overrides,
        task_overrides=task_overrides,
        fork_server=_fork_server(sup.get("fork_server", True)),
        job_cgroups=read.choice(sup.get("job_cgroups", "auto"), "[supervisor].job_cgroups",
                            _JOB_CGROUPS),
        tracing=_tracing(doc),
        redis_url_source=config_redis.url_source(doc, shown, env),
        redis_password_file=config_redis.password_file_path(doc, base_dir),
        **config_redis.read_replication(doc),
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
    table = read.table(doc.get("metrics", {}), "[metrics]")
    read.check_keys(table, _METRICS_KEYS, "[metrics]")
    return _listen(table.get("listen", DEFAULT_METRICS_LISTEN), "[metrics].listen")


def _tracing(doc: Mapping[str, Any]) -> TracingConfig:
    table = read.table(doc.get("tracing", {}), "[tracing]")
    read.check_keys(table, _TRACING_KEYS, "[tracing]")
    enabled = table.get("enabled", False)
    if not isinstance(enabled, bool):
        raise read.expected("[tracing].enabled", "true or false", enabled)
    setup = table.get("setup", "")
    if setup != "" and not (isinstance(setup, str) and _SETUP_RE.fullmatch(setup)):
        raise read.expected("[tracing].setup", '"module:function"', setup)
    if enabled and importlib.util.find_spec("opentelemetry") is None:
        raise read.Invalid("[tracing].enabled: OpenTelemetry is not installed "
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
