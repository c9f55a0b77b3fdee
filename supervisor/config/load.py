"""Load and validate the supervisor's TOML configuration.

The whole file is checked up front, before anything forks or touches Redis, so that a
typo is reported once, as one line that names the file, the key and what was expected
(``etc/forq.toml: [queue 2].concurrency: expected an integer >= 1, got "four"``), not
later as a traceback in a child process. Unknown keys are errors at every level: a
misspelt ``lease_tll`` silently falling back to a default only shows up in production.

Choices worth knowing (also in ``etc/forq.toml``):

* Durations and sizes use :mod:`forq.units` ("15s", "256MiB"); bare numbers are
  seconds / bytes. ``memory_limit = 0``: no limit; ``address_space_factor = 0``: no
  RLIMIT_AS backstop; ``memory_budget`` unset: no admission by memory.
* Secrets never live in the TOML: a password inside ``[redis].url`` is refused; use
  ``password_file`` (relative to the config file) or ``FORQ_REDIS_PASSWORD``.
  ``FORQ_REDIS_URL`` and ``FORQ_REDIS_PASSWORD`` win when set to a non-empty value;
  when the password comes from the environment the file is not read.
* ``Config.job_policy(queue)`` for a queue this supervisor does not serve returns
  ``[defaults]`` plus task overrides (no queue overrides apply).
* ``imports`` are only checked to be module names here; the supervisor imports them.

Every key is one row (`schema.Key`): the fields of `Config` declared with `key()` are
the rows of [supervisor], [redis] and [metrics]; the other tables have modules of their
own (`queues`, `redis_table`, `sandbox`, `schedules`, and [tracing] in
`forq.supervisor.observe.tracing`), and the job policy's rows are `forq.defaults`'s.
`TABLES` below lists them all, in the order `reference` documents them; `fields` reads
one value of any kind and words the error.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forq.defaults import DEFAULTS, JOB_POLICY, TASKS
from forq.supervisor.config import fields as read
from forq.supervisor.config import queues as config_queues
from forq.supervisor.config import redis_table as config_redis
from forq.supervisor.config import sandbox as config_sandbox
from forq.supervisor.config import schedules as config_schedules
from forq.supervisor.config import schema
from forq.supervisor.config.queues import MAX_PREFETCH, QueueConfig, read_queues
from forq.supervisor.config.sandbox import PROTECTIONS, SandboxConfig, read_sandbox
from forq.supervisor.config.schedules import ScheduleConfig, read_schedules
from forq.supervisor.config.schema import Table, key
from forq.supervisor.observe.tracing import TracingConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

__all__ = ["Config", "ConfigError", "MAX_PREFETCH", "QueueConfig", "PROTECTIONS",
           "SandboxConfig", "ScheduleConfig", "TABLES", "check_config_main", "load_config"]

DEFAULT_REDIS_URL = config_redis.DEFAULT_REDIS_URL
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"

# Built-in per-job policy, in the units the rest of forq stores (ms, bytes).
BUILTIN_POLICY = JOB_POLICY  # forq.defaults: the one source of every job default

SUPERVISOR, REDIS, METRICS = "[supervisor]", "[redis]", "[metrics]"
_FACTOR = "0 (off) or a number >= 1"


class ConfigError(Exception):
    """The configuration cannot be used; ``str()`` is one line for the user.

    Raised for everything a user can get wrong (missing file, TOML syntax,
    unknown key, wrong type, bad value), never for forq's own bugs, so the
    CLI can print it without a traceback and exit 2.
    """


# --------------------------------------------------------------------------
# Readers of the keys below that no other table shares


def _imports(value: object, where: str) -> list[str]:
    modules = read.string_list(value, where, "module names")
    return [read.simple_name(module, f"{where}[{i}]", read.MODULE_RE)
            for i, module in enumerate(modules)]


def _address_space_factor(value: object, where: str) -> float:
    factor = read.number(value, where, _FACTOR, 0.0)
    if 0 < factor < 1:
        raise read.expected(where, _FACTOR, factor)
    return factor


def _host_and_pid() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Config:
    """A validated supervisor configuration.

    Fields declared with `key()` are the rows of their keys (scope: the table); the
    others hold the tables read by their own modules, and what the loader works out.
    Durations are float seconds; per-job policy is exposed through
    :meth:`job_policy` in the integer milliseconds/bytes the job records use.
    """

    path: str
    queues: list[QueueConfig]
    sandbox: SandboxConfig
    schedules: list[ScheduleConfig]
    defaults: dict[str, int | float] = field(repr=False)
    queue_overrides: dict[str, dict[str, int | float]] = field(repr=False)
    task_overrides: dict[str, dict[str, int | float]] = field(repr=False)
    # OpenTelemetry job spans (supervisor/observe/tracing.py)
    tracing: TracingConfig = TracingConfig()

    # [supervisor]
    name: str = key(
        None, read.names(),
        "How this supervisor appears in leases, job history and metrics.",
        scope=SUPERVISOR, factory=_host_and_pid, shown="hostname:pid")
    lease_ttl: float = key(
        "15s", read.durations(positive=True),
        "A claimed job is this supervisor's for this long, renewed every third of it.",
        scope=SUPERVISOR)
    reaper_interval: float = key(
        "1s", read.durations(positive=True),
        "How often this supervisor looks for expired leases.",
        scope=SUPERVISOR)
    drain_timeout: float = key(
        "60s", read.durations(),
        "On SIGTERM, how long running jobs may finish before they are stopped and handed back.",
        scope=SUPERVISOR)
    imports: list[str] = key(
        [], read.Reader("a list of module names", _imports),
        "Modules imported before forking; importing them registers tasks.",
        scope=SUPERVISOR)
    memory_sample_interval: float = key(
        "50ms", read.durations(positive=True),
        "How often children's memory (outside a cgroup) and time limits are checked (1s if none run).",
        scope=SUPERVISOR)
    address_space_factor: float = key(
        4.0, read.Reader(_FACTOR, _address_space_factor),
        "Each child's RLIMIT_AS is this times its `memory_limit`, a backstop (0: none).",
        scope=SUPERVISOR)
    log_format: str = key(
        "text", read.choices("text", "json"),
        '`"text"` for people, `"json"` for log collectors.',
        scope=SUPERVISOR)
    # fork job children from a lean fork server (supervisor/fork/server.py), not from here
    fork_server: bool = key(
        True, read.BOOLEAN,
        "Fork jobs from a lean fork server (false: a fresh interpreter per job).",
        scope=SUPERVISOR)
    # per-job cgroup v2 memory limits (supervisor/isolation/cgroups.py)
    job_cgroups: str = key(
        "auto", read.choices("auto", "required", "off"),
        "A cgroup per job, the kernel enforcing `memory_limit`: where possible, required, or never.",
        scope=SUPERVISOR)
    # the fork server's memory on huge pages where available (supervisor/fork/hugepages.py)
    huge_pages: bool = key(
        True, read.BOOLEAN,
        "The fork server's memory on transparent huge pages where the kernel offers them.",
        scope=SUPERVISOR)
    # admission by memory (supervisor/children/budget.py)
    memory_budget: int | None = key(
        None, read.sizes(minimum=1 << 20),
        "Start jobs only while the running ones' `memory_limit`s and theirs fit in this (none: off).",
        scope=SUPERVISOR, shown="none")
    memory_reserve_after: float = key(
        "10s", read.durations(),
        "A job waiting this long for room reserves it: smaller jobs stop passing it.",
        scope=SUPERVISOR)
    job_cost: bool = key(  # supervisor/children/cost.py, lua/includes/cost.lua
        True, read.BOOLEAN,
        "Keep each job's cost: fields of its record, hourly usage per group, histograms.",
        scope=SUPERVISOR)
    # a deploy's label for the handler code, named with the fingerprint (fork/fingerprint.py)
    version: str = key(
        "", read.VERSION,
        "A label for the handler code (a release), in job records as `VERSION+FINGERPRINT`.",
        scope=SUPERVISOR, shown="none")

    # [redis] (redis_table.resolve then applies FORQ_REDIS_URL, cluster and the password)
    redis_url: str = key(
        DEFAULT_REDIS_URL, config_redis.URL,
        "`redis://host:port/db`, `rediss://` (TLS) or `unix:///path`; `FORQ_REDIS_URL` wins.",
        scope=REDIS, name="url")
    redis_password_file: str | None = key(
        None, config_redis.FILE_PATH,
        "A file holding the password, relative to this file; `FORQ_REDIS_PASSWORD` wins.",
        scope=REDIS, name="password_file")
    redis_cluster: bool = key(
        False, read.BOOLEAN,
        "A Redis Cluster, `url` naming any node.",
        scope=REDIS, name="cluster")
    redis_min_replicas: int = key(
        0, read.integers(0, 16),
        "After each batch of reports, WAIT for this many replicas.",
        scope=REDIS, name="min_replicas")
    redis_wait_timeout: float = key(
        "1s", read.durations(positive=True),
        "How long that WAIT may take.",
        scope=REDIS, name="wait_timeout")
    redis_allow_eviction: bool = key(
        False, read.BOOLEAN,
        "Start on a Redis whose `maxmemory-policy` may evict keys (only warn).",
        scope=REDIS, name="allow_eviction")
    # FORQ_REDIS_PASSWORD, or the password file's (never in a repr: reprs end up in logs)
    redis_password: str | None = field(default=None, repr=False)
    # where redis_url came from, said at start-up: an environment variable that silently
    # overrides the file's URL surprises people ("--redis" is set by `forq run --redis`)
    redis_url_source: str = ""

    # [metrics]
    metrics_listen: tuple[str, int] | None = key(
        DEFAULT_METRICS_LISTEN, read.LISTEN,
        "Prometheus metrics over HTTP at this address.",
        scope=METRICS, name="listen")

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


REDIS_ROWS = schema.rows(Config, REDIS)
SUPERVISOR_ROWS = schema.rows(Config, SUPERVISOR)
METRICS_ROWS = schema.rows(Config, METRICS)
TRACING_ROWS = schema.rows(TracingConfig, "[tracing]")
DEFAULTS_ROWS = schema.policy_rows(DEFAULTS)

# Every table, in the order the reference page documents them.
TABLES: tuple[Table, ...] = (
    Table(REDIS, "Where Redis is. Secrets never go in this file: a password inside `url` is "
          "refused.", REDIS_ROWS),
    Table(SUPERVISOR, "This supervisor process.", SUPERVISOR_ROWS),
    Table(DEFAULTS, "Each job's policy. A `[[queue]]`, then a `[tasks.\"name\"]` table, then "
          "(most keys) the producer, per job, override it, key by key.", DEFAULTS_ROWS),
    Table(config_queues.QUEUE, "A queue this supervisor serves (at least one). Any key of "
          "`[defaults]` may be set too, for the queue's jobs.",
          config_queues.ROWS + config_queues.POLICY_ROWS),
    Table(TASKS, "Any key of `[defaults]`, for one task's jobs, over its queue's.", schema.policy_rows(TASKS)),
    Table("[sandbox]", "What each child gives up before its handler runs.", config_sandbox.ROWS),
    Table('[sandbox.tasks."name"]', "A task's own sandbox.", config_sandbox.TASK_ROWS),
    Table(METRICS, "Prometheus metrics.", METRICS_ROWS),
    Table("[tracing]", "OpenTelemetry spans per job run.", TRACING_ROWS),
    Table(config_schedules.SCOPE, "A periodic job: each tick is enqueued once, however many "
          "supervisors run.", config_schedules.ROWS),
)
_TOP_KEYS = tuple(dict.fromkeys(table.top for table in TABLES))


def check_redis_url(url: str, where: str) -> None:
    """ConfigError naming `where` unless `url` is a Redis URL forq can use."""
    try:
        config_redis.check_url(url, where)
    except read.Invalid as exc:
        raise ConfigError(str(exc)) from None


# --------------------------------------------------------------------------
# Sections


def _table(doc: Mapping[str, Any], title: str, rows: tuple[schema.Key, ...]) -> dict[str, Any]:
    """The keys of the table `title` ("[redis]") read by its rows: {attribute: value}."""
    return schema.read_rows(read.table(doc.get(title.strip("[]"), {}), title), rows, title)


def _check_policy(policy: Mapping[str, int | float], where: str, budget: int | None = None) -> None:
    """Checks that span keys, made on the merged policy since levels mix."""
    if policy["backoff_max_ms"] < policy["backoff_base_ms"]:
        raise read.Invalid(
            f"{where}: backoff.max ({policy['backoff_max_ms']}ms) is less than "
            f"backoff.base ({policy['backoff_base_ms']}ms)"
        )
    if budget is not None and policy["memory_limit"] > budget:
        raise read.Invalid(f"{where}: memory_limit ({read.bytes_text(int(policy['memory_limit']))}) "
                           f"is over [supervisor].memory_budget ({read.bytes_text(budget)}): "
                           "its jobs could never start here")


def _tasks(doc: Mapping[str, Any]) -> dict[str, dict[str, int | float]]:
    tasks = read.table(doc.get("tasks", {}), "[tasks]")
    rows = schema.policy_rows(TASKS)
    out: dict[str, dict[str, int | float]] = {}
    for task, value in tasks.items():
        prefix = f"[tasks.{json.dumps(task, ensure_ascii=False)}]"
        out[task] = schema.read_rows(read.table(value, prefix), rows, prefix)
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
    redis = _table(doc, REDIS, REDIS_ROWS)
    supervisor = _table(doc, SUPERVISOR, SUPERVISOR_ROWS)
    defaults = {**BUILTIN_POLICY, **_table(doc, DEFAULTS, DEFAULTS_ROWS)}
    _check_policy(defaults, DEFAULTS)
    queues, queue_overrides = read_queues(doc)
    task_overrides = _tasks(doc)
    config = Config(
        path=shown,
        queues=queues,
        sandbox=read_sandbox(doc),
        schedules=read_schedules(doc),
        defaults=defaults,
        queue_overrides=queue_overrides,
        task_overrides=task_overrides,
        tracing=TracingConfig(**_table(doc, "[tracing]", TRACING_ROWS)),
        **redis,
        **supervisor,
        **_table(doc, METRICS, METRICS_ROWS),
    )
    config = config_redis.resolve(config, doc.get("redis", {}), env, base_dir, shown)
    # job_policy() of a queue not served here is [defaults] + task overrides.
    for queue_name in [None, *(q.name for q in queues)]:
        policy = config.job_policy(queue_name or "")
        on_queue = f' on queue "{queue_name}"' if queue_name else ""
        budget = config.memory_budget if queue_name else None  # only where served
        if queue_name:
            _check_policy(policy["defaults"], f'[queue "{queue_name}"]', budget)
        for task, task_policy in policy["tasks"].items():
            _check_policy(task_policy, f"[tasks.{json.dumps(task)}]{on_queue}", budget)
    return config


def check_config_main(path: str) -> int:
    """``forq config check PATH``: 0 and an ``ok:`` line, or 2 and the error on stderr."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"ok: {path} ({len(config.queues)} queues, {len(config.schedules)} schedules)")
    return 0
