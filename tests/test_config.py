"""Tests for supervisor.config: loading, validation messages, policy merging, schedules."""

import datetime as dt
import os
import pwd
import textwrap
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pytest

from forq.supervisor.config.load import (
    Config,
    ConfigError,
    QueueConfig,
    SandboxConfig,
    ScheduleConfig,
    check_config_main,
    load_config,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "etc" / "forq.toml"
QUEUE = '[[queue]]\nname = "q"\nconcurrency = 1\n'
UTC = dt.timezone.utc

POLICY_FIELDS = {
    "timeout_ms",
    "memory_limit",
    "max_attempts",
    "max_crashes",
    "max_snoozes",
    "result_ttl_ms",
    "idempotency_ttl_ms",
    "max_result_bytes",
    "backoff_base_ms",
    "backoff_factor",
    "backoff_max_ms",
    "backoff_jitter",
    "breaker_failures",
    "breaker_window_ms",
    "breaker_ratio",
    "breaker_cooldown_ms",
}
BUILTIN = {
    "timeout_ms": 300_000,
    "memory_limit": 512 * 1024**2,
    "max_attempts": 5,
    "max_crashes": 3,
    "max_snoozes": 100,
    "result_ttl_ms": 86_400_000,
    "idempotency_ttl_ms": 86_400_000,
    "max_result_bytes": 1024**2,
    "backoff_base_ms": 1000,
    "backoff_factor": 2.0,
    "backoff_max_ms": 600_000,
    "backoff_jitter": 0.2,
    "breaker_failures": 20,
    "breaker_window_ms": 60_000,
    "breaker_ratio": 0.9,
    "breaker_cooldown_ms": 600_000,
}


def write(tmp_path: Path, text: str, name: str = "forq.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def load(tmp_path: Path, text: str, env: dict | None = None) -> Config:
    return load_config(write(tmp_path, text), env=env or {})


def error(tmp_path: Path, text: str, env: dict | None = None) -> str:
    """Load ``text`` expecting a ConfigError; return its one-line message."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env or {})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message[len(f"{path}: ") :]


def needs_zone(name: str) -> None:
    try:
        ZoneInfo(name)
    except ZoneInfoNotFoundError:
        pytest.skip(f"time zone {name} not installed")


# -- the shipped example -----------------------------------------------------


def test_example_config_loads():
    config = load_config(EXAMPLE, env={})
    assert config.path == str(EXAMPLE)
    assert config.redis_url == "redis://127.0.0.1:6379/0"
    assert config.redis_password is None
    assert config.lease_ttl == 15.0
    assert config.reaper_interval == 1.0
    assert config.drain_timeout == 60.0
    assert config.imports == ["forq.examples"]
    assert config.memory_sample_interval == pytest.approx(0.05)
    assert config.log_format == "text"
    assert {q.name: q.concurrency for q in config.queues} == {"default": 4, "reports": 1}
    assert config.metrics_listen == ("127.0.0.1", 9464)
    assert config.sandbox == SandboxConfig()
    assert [s.queue for s in config.schedules] == ["reports"]
    assert config.schedules[0].task == "examples.report"
    assert "images.resize" in config.job_policy("default")["tasks"]
    assert config.job_policy("default")["tasks"]["images.resize"]["timeout_ms"] == 30_000


def test_example_config_check(capsys):
    assert check_config_main(str(EXAMPLE)) == 0
    out, err = capsys.readouterr()
    assert out == f"ok: {EXAMPLE} (2 queues, 1 schedules)\n"
    assert err == ""


# -- defaults ----------------------------------------------------------------


def test_minimal_config_gets_every_default(tmp_path):
    config = load(tmp_path, QUEUE)
    assert config.redis_url == "redis://127.0.0.1:6379/0"
    assert config.redis_password is None
    assert config.name.endswith(f":{os.getpid()}")
    assert (config.lease_ttl, config.reaper_interval, config.drain_timeout) == (15.0, 1.0, 60.0)
    assert config.imports == []
    assert config.memory_sample_interval == pytest.approx(0.05)
    assert config.address_space_factor == 4.0
    assert config.log_format == "text"
    assert config.job_cgroups == "auto"
    assert config.version == ""
    assert config.queues == [QueueConfig(name="q", concurrency=1)]
    assert config.queues[0].nice == 10 and config.queues[0].priority == 0
    # prefetch "auto": 4 jobs leased ahead of the free slots, only while jobs are short
    assert config.queues[0].prefetch == "auto"
    assert config.queues[0].rate_limit is None and config.queues[0].max_in_flight is None
    assert config.sandbox == SandboxConfig(run_as=None, env_allow=None, max_open_files=None)
    assert config.metrics_listen == ("127.0.0.1", 9464)
    assert config.schedules == []
    assert config.job_policy("q") == {"defaults": BUILTIN, "tasks": {}}


def test_full_config_values(tmp_path):
    user = pwd.getpwuid(os.getuid()).pw_name
    config = load(
        tmp_path,
        f"""
        [supervisor]
        name = "web-1"
        lease_ttl = "30s"
        reaper_interval = "500ms"
        drain_timeout = 0
        imports = ["a.b", "c"]
        memory_sample_interval = 0.1
        address_space_factor = 0
        log_format = "json"

        [[queue]]
        name = "low"
        concurrency = 2
        priority = -1
        [[queue]]
        name = "high"
        concurrency = 8
        priority = 5
        nice = 0
        rate_limit = "50/m"
        max_in_flight = 3
        prefetch = 16
        max_throttle = "1h"
        max_snoozes = 7
        [[queue]]
        name = "mid"
        concurrency = 1
        prefetch = "auto"

        [sandbox]
        run_as = "{user}"
        env_allow = ["PATH"]
        max_open_files = 256

        [metrics]
        listen = "[::1]:0"
        """,
    )
    assert config.name == "web-1"
    assert (config.lease_ttl, config.reaper_interval, config.drain_timeout) == (30.0, 0.5, 0.0)
    assert config.imports == ["a.b", "c"]
    assert config.memory_sample_interval == 0.1
    assert config.address_space_factor == 0.0
    assert config.log_format == "json"
    assert [q.name for q in config.queues] == ["high", "mid", "low"]
    high = config.queue("high")
    assert (high.concurrency, high.priority, high.nice) == (8, 5, 0)
    assert high.rate_limit == (50.0, 60.0)
    assert high.max_in_flight == 3 and high.prefetch == 16
    # "auto": the held jobs only while the queue's jobs are short (leases.held.ShortJobs)
    assert config.queue("mid").prefetch == "auto"
    assert high.max_throttle == 3600.0 and config.queue("low").max_throttle == 600.0
    assert config.job_policy("high")["defaults"]["max_snoozes"] == 7
    assert config.sandbox == SandboxConfig(run_as=user, env_allow=("PATH",), max_open_files=256)
    assert config.metrics_listen == ("::1", 0)
    with pytest.raises(KeyError):
        config.queue("nope")


def test_queues_of_equal_priority_keep_file_order(tmp_path):
    text = "".join(f'[[queue]]\nname = "{n}"\nconcurrency = 1\n' for n in "cab")
    assert [q.name for q in load(tmp_path, text).queues] == ["c", "a", "b"]


def test_metrics_off(tmp_path):
    assert load(tmp_path, QUEUE + '[metrics]\nlisten = ""\n').metrics_listen is None


# -- job policy merging --------------------------------------------------------


POLICY_TOML = """
[defaults]
timeout = "1m"
memory_limit = "100MiB"
max_attempts = 2
backoff = { base = "2s", jitter = 0 }

[[queue]]
name = "big"
concurrency = 1
memory_limit = "200MiB"
result_ttl = "1h"
backoff = { max = "30s" }

[[queue]]
name = "plain"
concurrency = 1

[tasks."images.resize"]
timeout = "10s"
max_crashes = 0

[tasks.other]
max_result_bytes = "10KB"
backoff.factor = 3
"""


def test_job_policy_defaults_then_queue_then_task(tmp_path):
    config = load(tmp_path, POLICY_TOML)

    big = config.job_policy("big")
    assert set(big) == {"defaults", "tasks"}
    assert set(big["defaults"]) == POLICY_FIELDS
    assert big["defaults"] == {
        **BUILTIN,
        "timeout_ms": 60_000,  # [defaults]
        "max_attempts": 2,  # [defaults]
        "memory_limit": 200 * 1024**2,  # queue beats [defaults]
        "result_ttl_ms": 3_600_000,  # queue
        "backoff_base_ms": 2000,  # [defaults]
        "backoff_jitter": 0.0,  # [defaults]
        "backoff_max_ms": 30_000,  # queue, other backoff keys still inherited
    }
    resize = big["tasks"]["images.resize"]
    assert resize == {**big["defaults"], "timeout_ms": 10_000, "max_crashes": 0}
    # the task did not set memory_limit, so the queue's value applies to it
    assert resize["memory_limit"] == 200 * 1024**2
    other = big["tasks"]["other"]
    assert other == {**big["defaults"], "max_result_bytes": 10_000, "backoff_factor": 3.0}

    plain = config.job_policy("plain")
    assert plain["defaults"]["memory_limit"] == 100 * 1024**2
    assert plain["defaults"]["backoff_max_ms"] == 600_000
    assert plain["tasks"]["images.resize"]["memory_limit"] == 100 * 1024**2
    assert plain["tasks"]["images.resize"]["timeout_ms"] == 10_000

    # a queue not served here (e.g. a schedule's target) gets [defaults] + tasks
    assert config.job_policy("elsewhere") == config.job_policy("plain")


def test_job_policy_values_are_plain_numbers(tmp_path):
    policy = load(tmp_path, POLICY_TOML).job_policy("big")
    for entry in [policy["defaults"], *policy["tasks"].values()]:
        for key in POLICY_FIELDS - {"backoff_factor", "backoff_jitter", "breaker_ratio"}:
            assert type(entry[key]) is int, key
        assert type(entry["backoff_factor"]) is float
        assert type(entry["backoff_jitter"]) is float
        assert type(entry["breaker_ratio"]) is float


def test_job_policy_returns_fresh_dicts(tmp_path):
    config = load(tmp_path, POLICY_TOML)
    config.job_policy("big")["defaults"]["timeout_ms"] = 1
    config.job_policy("big")["tasks"]["other"]["timeout_ms"] = 1
    assert config.job_policy("big")["defaults"]["timeout_ms"] == 60_000
    assert config.job_policy("big")["tasks"]["other"]["timeout_ms"] == 60_000


def test_memory_limit_zero_means_unlimited(tmp_path):
    config = load(tmp_path, QUEUE + "memory_limit = 0\n")
    assert config.job_policy("q")["defaults"]["memory_limit"] == 0


# -- redis -------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["redis://localhost:6380/2", "rediss://cache.example:6379/0", "unix:///run/redis.sock"]
)
def test_redis_url_schemes(tmp_path, url):
    assert load(tmp_path, f'[redis]\nurl = "{url}"\n' + QUEUE).redis_url == url


def test_env_redis_url_overrides(tmp_path):
    text = '[redis]\nurl = "redis://a:1/0"\n' + QUEUE
    assert (
        load(tmp_path, text, env={"FORQ_REDIS_URL": "redis://b:2/3"}).redis_url == "redis://b:2/3"
    )
    assert load(tmp_path, text, env={"FORQ_REDIS_URL": ""}).redis_url == "redis://a:1/0"


def test_env_redis_url_is_validated(tmp_path):
    message = error(tmp_path, QUEUE, env={"FORQ_REDIS_URL": "http://x"})
    assert message.startswith('FORQ_REDIS_URL: expected a URL such as "redis://')
    assert message.endswith('got "http://x"')


def test_bad_urls_never_echo_a_password(tmp_path):
    message = error(tmp_path, QUEUE, env={"FORQ_REDIS_URL": "http://user:s3cret@x:1/0"})
    assert "s3cret" not in message
    assert message.endswith('got "http://user:***@x:1/0"')


def test_malformed_ipv6_url(tmp_path):
    message = error(tmp_path, '[redis]\nurl = "redis://[::1:6379/0"\n' + QUEUE)
    assert message.startswith('[redis].url: expected a URL such as "redis://127.0.0.1:6379/0"')


def test_env_redis_url_may_carry_a_password(tmp_path):
    url = "redis://:s3cret@host:6379/0"
    assert load(tmp_path, QUEUE, env={"FORQ_REDIS_URL": url}).redis_url == url


def test_password_file_relative_to_config(tmp_path):
    (tmp_path / "secret").write_text("  hunter2\n")
    config = load(tmp_path, '[redis]\npassword_file = "secret"\n' + QUEUE)
    assert config.redis_password == "hunter2"


def test_password_file_absolute(tmp_path):
    secret = tmp_path / "elsewhere.pw"
    secret.write_text("pw\n")
    other = tmp_path / "conf"
    other.mkdir()
    config = load(other, f'[redis]\npassword_file = "{secret}"\n' + QUEUE)
    assert config.redis_password == "pw"


def test_env_password_wins_and_file_is_not_needed(tmp_path):
    config = load(
        tmp_path,
        '[redis]\npassword_file = "/does/not/exist"\n' + QUEUE,
        env={"FORQ_REDIS_PASSWORD": "from-env"},
    )
    assert config.redis_password == "from-env"
    assert load(tmp_path, QUEUE, env={"FORQ_REDIS_PASSWORD": "x"}).redis_password == "x"


def test_missing_password_file(tmp_path):
    message = error(tmp_path, '[redis]\npassword_file = "nope.pw"\n' + QUEUE)
    assert message == f"[redis].password_file: missing file {tmp_path / 'nope.pw'}"


def test_unreadable_password_file(tmp_path):
    (tmp_path / "dir.pw").mkdir()
    message = error(tmp_path, '[redis]\npassword_file = "dir.pw"\n' + QUEUE)
    assert message.startswith(f"[redis].password_file: cannot read {tmp_path / 'dir.pw'}: ")


def test_empty_password_file(tmp_path):
    (tmp_path / "empty.pw").write_text("\n")
    message = error(tmp_path, '[redis]\npassword_file = "empty.pw"\n' + QUEUE)
    assert message == f"[redis].password_file: {tmp_path / 'empty.pw'} is empty"


def test_password_in_url_is_refused(tmp_path):
    message = error(tmp_path, '[redis]\nurl = "redis://:s3cret@host:6379/0"\n' + QUEUE)
    assert message.startswith("[redis].url: contains a password")
    assert "s3cret" not in message
    assert "password_file" in message and "FORQ_REDIS_PASSWORD" in message


# -- schedules ---------------------------------------------------------------


def schedule(cron: str, **extra: str) -> str:
    lines = [
        "[[schedule]]",
        'name = "s"',
        f'cron = "{cron}"',
        'queue = "reports"',
        'task = "reports.nightly"',
    ]
    lines += [f"{key} = {value}" for key, value in extra.items()]
    return QUEUE + "\n".join(lines) + "\n"


def test_schedule_fields(tmp_path):
    config = load(
        tmp_path,
        schedule(
            "0 3 * * *",
            args='[1, "two"]',
            kwargs="{ a = 1 }",
            catch_up='"all"',
            max_catch_up="7",
        ),
    )
    [sched] = config.schedules
    assert sched == ScheduleConfig(
        name="s",
        cron="0 3 * * *",
        queue="reports",
        task="reports.nightly",
        timezone="UTC",
        args=[1, "two"],
        kwargs={"a": 1},
        catch_up="all",
        max_catch_up=7,
        every=None,
    )


def test_schedule_defaults(tmp_path):
    [sched] = load(tmp_path, schedule("@daily")).schedules
    assert (sched.timezone, sched.args, sched.kwargs) == ("UTC", [], {})
    assert (sched.catch_up, sched.max_catch_up, sched.every) == ("latest", 100, None)


def test_schedule_every(tmp_path):
    [sched] = load(tmp_path, schedule("@every 1m30s")).schedules
    assert sched.every == 90.0
    assert sched.cron == "@every 1m30s"


def test_every_ticks_are_anchored_at_the_epoch():
    sched = ScheduleConfig(name="s", cron="@every 30s", queue="q", task="t", every=30.0)
    start = dt.datetime(2024, 1, 1, 0, 0, 10, tzinfo=UTC)
    assert sched.next_after(start) == dt.datetime(2024, 1, 1, 0, 0, 30, tzinfo=UTC)
    # strictly after: a tick time itself moves on to the next one
    on_tick = dt.datetime(2024, 1, 1, 0, 0, 30, tzinfo=UTC)
    assert sched.next_after(on_tick) == dt.datetime(2024, 1, 1, 0, 1, 0, tzinfo=UTC)
    # the same instant in another zone gives the same tick
    plus2 = dt.timezone(dt.timedelta(hours=2))
    assert sched.next_after(start.astimezone(plus2)) == sched.next_after(start)

    odd = ScheduleConfig(name="s", cron="@every 7s", queue="q", task="t", every=7.0)
    tick = odd.next_after(start)
    assert tick.timestamp() % 7 == 0
    assert 0 < (tick - start).total_seconds() <= 7


def test_every_subsecond_is_exact():
    sched = ScheduleConfig(name="s", cron="@every 250ms", queue="q", task="t", every=0.25)
    start = dt.datetime(2024, 1, 1, 0, 0, 0, 100_000, tzinfo=UTC)
    assert sched.next_after(start) == dt.datetime(2024, 1, 1, 0, 0, 0, 250_000, tzinfo=UTC)


def test_cron_next_after_in_utc():
    sched = ScheduleConfig(name="s", cron="0 3 * * *", queue="q", task="t")
    start = dt.datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
    assert sched.next_after(start) == dt.datetime(2024, 6, 2, 3, 0, tzinfo=UTC)
    at_tick = dt.datetime(2024, 6, 2, 3, 0, tzinfo=UTC)
    assert sched.next_after(at_tick) == dt.datetime(2024, 6, 3, 3, 0, tzinfo=UTC)


def test_cron_next_after_uses_the_schedule_timezone():
    needs_zone("Europe/Paris")
    sched = ScheduleConfig(name="s", cron="0 3 * * *", queue="q", task="t", timezone="Europe/Paris")
    start = dt.datetime(2024, 6, 1, 0, 0, tzinfo=UTC)
    tick = sched.next_after(start)
    assert tick == dt.datetime(2024, 6, 1, 1, 0, tzinfo=UTC)  # 03:00 CEST
    assert tick.tzinfo == ZoneInfo("Europe/Paris")


def test_cron_macro_next_after():
    sched = ScheduleConfig(name="s", cron="@hourly", queue="q", task="t")
    start = dt.datetime(2024, 6, 1, 12, 34, tzinfo=UTC)
    assert sched.next_after(start) == dt.datetime(2024, 6, 1, 13, 0, tzinfo=UTC)


def test_next_after_refuses_naive_datetimes():
    sched = ScheduleConfig(name="s", cron="@hourly", queue="q", task="t")
    with pytest.raises(ValueError, match="aware"):
        sched.next_after(dt.datetime(2024, 1, 1))


@pytest.mark.parametrize(
    "cron",
    ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly", "@HOURLY"],
)
def test_cron_macros_accepted(tmp_path, cron):
    assert load(tmp_path, schedule(cron)).schedules[0].every is None


def test_schedule_queue_need_not_be_served(tmp_path):
    config = load(tmp_path, schedule("*/5 * * * MON-FRI"))
    assert config.schedules[0].queue == "reports"
    assert [q.name for q in config.queues] == ["q"]


# -- errors --------------------------------------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "x" / "y.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == f"missing file {path}"


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path, env={})
    assert str(info.value) == f"{tmp_path}: is a directory, expected a TOML file"


def test_bad_toml_syntax_names_the_line(tmp_path):
    message = error(tmp_path, QUEUE + "\n\nthis is not toml\n")
    assert message.startswith("invalid TOML: ")
    assert "line 6" in message


def test_not_utf8(tmp_path):
    path = tmp_path / "forq.toml"
    path.write_bytes(b"# caf\xe9\n" + QUEUE.encode())
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == f"{path}: not UTF-8 text (byte 5)"


def test_queue_concurrency_message_matches_the_design(tmp_path):
    text = QUEUE + '[[queue]]\nname = "r"\nconcurrency = "four"\n'
    assert error(tmp_path, text) == '[queue 2].concurrency: expected an integer >= 1, got "four"'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # unknown keys, at every level, with a suggestion when one is close
        (
            '[supervisor]\nlease_tll = "15s"\n' + QUEUE,
            "unknown key [supervisor].lease_tll (did you mean lease_ttl?)",
        ),
        ('[redis]\nhost = "x"\n' + QUEUE, "unknown key [redis].host"),
        (
            "[defaults]\ntimout = 1\n" + QUEUE,
            "unknown key [defaults].timout (did you mean timeout?)",
        ),
        (
            '[defaults]\nbackoff = { bas = "1s" }\n' + QUEUE,
            "unknown key [defaults].backoff.bas (did you mean base?)",
        ),
        (QUEUE + "colour = 1\n", "unknown key [queue 1].colour"),
        (QUEUE + '[tasks."a.b"]\nretries = 3\n', 'unknown key [tasks."a.b"].retries'),
        (QUEUE + '[sandbox]\nuser = "x"\n', "unknown key [sandbox].user"),
        (QUEUE + "[metrics]\nport = 1\n", "unknown key [metrics].port"),
        ('[queues]\nname = "q"\n' + QUEUE, "unknown key [queues] (did you mean queue?)"),
        ("debug = true\n" + QUEUE, "unknown key debug"),
        (
            QUEUE
            + '[[schedule]]\nname = "n"\ncron = "@daily"\nqueue = "q"\ntask = "t"\nevery = 1\n',
            'unknown key [schedule "n"].every',
        ),
        # wrong types
        ('supervisor = "x"\n' + QUEUE, '[supervisor]: expected a table, got "x"'),
        (
            'schedule = "x"\n' + QUEUE,
            'schedule: expected an array of tables written [[schedule]], got "x"',
        ),
        ("[[supervisor]]\n" + QUEUE, "[supervisor]: expected a table, got [a table]"),
        (
            '[queue]\nname = "q"\nconcurrency = 1\n',
            "queue: expected an array of tables written [[queue]], got a table",
        ),
        (QUEUE + "[tasks]\nx = 1\n", '[tasks."x"]: expected a table, got 1'),
        (
            '[supervisor]\nimports = "forq.examples"\n' + QUEUE,
            '[supervisor].imports: expected a list of module names, got "forq.examples"',
        ),
        (
            "[supervisor]\nimports = [1]\n" + QUEUE,
            "[supervisor].imports[0]: expected module names, got 1",
        ),
        (
            '[supervisor]\nimports = ["not a module"]\n' + QUEUE,
            "[supervisor].imports[0]: expected a name of letters, digits, '_', '.' or '-', got \"not a module\"",
        ),
        ("[supervisor]\nname = 7\n" + QUEUE, "[supervisor].name: expected a name"),
        (
            '[supervisor]\nlog_format = "xml"\n' + QUEUE,
            '[supervisor].log_format: expected one of "text", "json", got "xml"',
        ),
        (
            '[supervisor]\nversion = "1.0+local"\n' + QUEUE,
            "[supervisor].version: expected up to 64 letters, digits, '.', '_', ':', '~' or "
            "'-'",
        ),
        ("[supervisor]\nversion = 3\n" + QUEUE, "[supervisor].version: expected up to 64"),
        (
            '[supervisor]\njob_cgroups = true\n' + QUEUE,
            '[supervisor].job_cgroups: expected one of "auto", "required", "off", got true',
        ),
        (
            "[supervisor]\naddress_space_factor = 0.5\n" + QUEUE,
            "[supervisor].address_space_factor: expected 0 (off) or a number >= 1, got 0.5",
        ),
        (
            '[supervisor]\naddress_space_factor = "4"\n' + QUEUE,
            '[supervisor].address_space_factor: expected 0 (off) or a number >= 1, got "4"',
        ),
        (
            "[redis]\nurl = 6379\n" + QUEUE,
            "[redis].url: expected a redis://, rediss:// or unix:// URL, got 6379",
        ),
        (
            '[redis]\nurl = "localhost:6379"\n' + QUEUE,
            '[redis].url: expected a URL such as "redis://127.0.0.1:6379/0"',
        ),
        (
            '[redis]\nurl = "redis://h:99999/0"\n' + QUEUE,
            "[redis].url: expected a URL with a port from 0 to 65535",
        ),
        (
            "[redis]\npassword_file = 1\n" + QUEUE,
            "[redis].password_file: expected a file path, got 1",
        ),
        # durations, sizes, numbers
        (
            '[supervisor]\nlease_ttl = "5 parsecs"\n' + QUEUE,
            '[supervisor].lease_ttl: expected a duration such as "250ms", "15s" or "5m", got "5 parsecs"',
        ),
        (
            '[supervisor]\nlease_ttl = "0s"\n' + QUEUE,
            '[supervisor].lease_ttl: expected a duration > 0 such as "250ms", "15s" or "5m", got "0s"',
        ),
        (
            "[supervisor]\nreaper_interval = 0\n" + QUEUE,
            "[supervisor].reaper_interval: expected a duration > 0",
        ),
        (
            "[supervisor]\nmemory_sample_interval = true\n" + QUEUE,
            "[supervisor].memory_sample_interval: expected a duration such as",
        ),
        ('[defaults]\ntimeout = "0ms"\n' + QUEUE, "[defaults].timeout: expected a duration > 0"),
        (
            '[defaults]\nresult_ttl = "forever"\n' + QUEUE,
            "[defaults].result_ttl: expected a duration such as",
        ),
        (
            '[defaults]\nmemory_limit = "512M"\n' + QUEUE,
            '[defaults].memory_limit: expected a size such as "64KiB", "256MiB" or "1GiB", got "512M"',
        ),
        (
            "[defaults]\nmax_result_bytes = 0\n" + QUEUE,
            "[defaults].max_result_bytes: expected a size of at least 1 byte",
        ),
        (
            "[defaults]\nmax_attempts = 0\n" + QUEUE,
            "[defaults].max_attempts: expected an integer >= 1, got 0",
        ),
        (
            "[defaults]\nmax_attempts = 2.0\n" + QUEUE,
            "[defaults].max_attempts: expected an integer >= 1, got 2.0",
        ),
        (
            "[defaults]\nmax_crashes = -1\n" + QUEUE,
            "[defaults].max_crashes: expected an integer >= 0, got -1",
        ),
        (
            "[defaults]\nmax_crashes = true\n" + QUEUE,
            "[defaults].max_crashes: expected an integer >= 0, got true",
        ),
        ('[defaults]\nbackoff = "1s"\n' + QUEUE, '[defaults].backoff: expected a table, got "1s"'),
        (
            "[defaults]\nbackoff = { factor = 0.5 }\n" + QUEUE,
            "[defaults].backoff.factor: expected a number >= 1.0, got 0.5",
        ),
        (
            "[defaults]\nbackoff = { jitter = 2 }\n" + QUEUE,
            "[defaults].backoff.jitter: expected a number from 0.0 to 1.0, got 2",
        ),
        (
            '[defaults]\nbackoff = { base = "1m", max = "1s" }\n' + QUEUE,
            "[defaults]: backoff.max (1000ms) is less than backoff.base (60000ms)",
        ),
        (
            QUEUE + 'backoff = { max = "100ms" }\n',
            '[queue "q"]: backoff.max (100ms) is less than backoff.base (1000ms)',
        ),
        (
            QUEUE + '[tasks.t]\nbackoff = { base = "1h" }\n',
            '[tasks."t"]: backoff.max (600000ms) is less than backoff.base (3600000ms)',
        ),
        (
            QUEUE + '[tasks.t]\ntimeout = "soon"\n',
            '[tasks."t"].timeout: expected a duration such as',
        ),
        # queues
        ("", "no queues: add at least one [[queue]] with name and concurrency"),
        ("queue = []\n", "no queues"),
        ("[[queue]]\nconcurrency = 1\n", "[queue 1]: missing required key name"),
        ('[[queue]]\nname = "q"\n', "[queue 1]: missing required key concurrency"),
        (
            '[[queue]]\nname = "q"\nconcurrency = 0\n',
            "[queue 1].concurrency: expected an integer >= 1, got 0",
        ),
        (
            '[[queue]]\nname = "a{b}"\nconcurrency = 1\n',
            "[queue 1].name: expected a name of letters, digits",
        ),
        ('[[queue]]\nname = ""\nconcurrency = 1\n', "[queue 1].name: expected a name"),
        (QUEUE + QUEUE, '[queue 2].name: duplicate queue "q"'),
        (QUEUE + "nice = 20\n", "[queue 1].nice: expected an integer from 0 to 19, got 20"),
        (QUEUE + "prefetch = -1\n",
         '[queue 1].prefetch: expected "auto" or an integer from 0 to 1000, got -1'),
        (QUEUE + "prefetch = 1001\n",
         '[queue 1].prefetch: expected "auto" or an integer from 0 to 1000, got 1001'),
        (QUEUE + 'prefetch = "4"\n',
         '[queue 1].prefetch: expected "auto" or an integer from 0 to 1000, got "4"'),
        (QUEUE + "prefetch = true\n",
         '[queue 1].prefetch: expected "auto" or an integer from 0 to 1000, got true'),
        (QUEUE + 'max_throttle = "25h"\n',
         '[queue 1].max_throttle: expected a duration up to "24h" (0: throttles pause nothing), '
         'got "25h"'),
        (QUEUE + "max_snoozes = -1\n", "[queue 1].max_snoozes: expected an integer >= 0, got -1"),
        (QUEUE + 'priority = "high"\n', '[queue 1].priority: expected an integer, got "high"'),
        (
            QUEUE + 'rate_limit = "fast"\n',
            '[queue 1].rate_limit: expected a rate such as "100/s", "50/m" or "3/h", got "fast"',
        ),
        (QUEUE + "rate_limit = 100\n", "[queue 1].rate_limit: expected a rate such as"),
        (QUEUE + "max_in_flight = 0\n", "[queue 1].max_in_flight: expected an integer >= 1, got 0"),
        (QUEUE + 'memory_limit = "lots"\n', "[queue 1].memory_limit: expected a size such as"),
        # sandbox
        (
            QUEUE + '[sandbox]\nrun_as = "no-such-user-forq"\n',
            '[sandbox].run_as: no such user "no-such-user-forq" on this machine',
        ),
        (
            QUEUE + '[sandbox]\nenv_allow = "PATH"\n',
            '[sandbox].env_allow: expected a list of environment variable names, got "PATH"',
        ),
        (
            QUEUE + "[sandbox]\nmax_open_files = 3\n",
            "[sandbox].max_open_files: expected an integer >= 16, got 3",
        ),
        # metrics
        (
            QUEUE + '[metrics]\nlisten = "9464"\n',
            '[metrics].listen: expected host:port such as "127.0.0.1:9464" (or "" for off), got "9464"',
        ),
        (QUEUE + '[metrics]\nlisten = ":9464"\n', "[metrics].listen: expected host:port"),
        (QUEUE + '[metrics]\nlisten = "localhost:http"\n', "[metrics].listen: expected host:port"),
        (QUEUE + '[metrics]\nlisten = "localhost:70000"\n', "[metrics].listen: expected host:port"),
        (QUEUE + "[metrics]\nlisten = 9464\n", "[metrics].listen: expected host:port"),
    ],
)
def test_error_messages(tmp_path, text, expected):
    assert error(tmp_path, text).startswith(expected)


def test_version_labels_the_handler_code(tmp_path):
    assert load(tmp_path, '[supervisor]\nversion = "2024.06.1-rc1"\n' + QUEUE).version == \
        "2024.06.1-rc1"
    assert load(tmp_path, '[supervisor]\nversion = "g1a2b3c4"\n' + QUEUE).version == "g1a2b3c4"


@pytest.mark.parametrize(
    ("cron", "extra", "expected"),
    [
        (
            "61 * * * *",
            {},
            '[schedule "s"].cron: expected a valid cron expression (Bad minute), got "61 * * * *"',
        ),
        (
            "* * * *",
            {},
            '[schedule "s"].cron: expected a 5-field cron expression such as "0 3 * * *", got "* * * *"',
        ),
        ("0 0 * * * *", {}, '[schedule "s"].cron: expected a 5-field cron expression'),
        (
            "0 0 30 2 *",
            {},
            '[schedule "s"].cron: expected a valid cron expression (Bad day-of-month)',
        ),
        ("@sometimes", {}, '[schedule "s"].cron: expected one of @annually, @daily'),
        (
            "@every",
            {},
            '[schedule "s"].cron: expected "@every <duration>" such as "@every 30s", got "@every"',
        ),
        (
            "@every soon",
            {},
            '[schedule "s"].cron: expected a duration such as "250ms", "15s" or "5m", got "soon"',
        ),
        ("@every 0s", {}, '[schedule "s"].cron: expected a duration > 0'),
        (
            "@daily",
            {"timezone": '"Mars/Olympus"'},
            '[schedule "s"].timezone: expected an IANA time zone such as "UTC" or "Europe/Paris", got "Mars/Olympus"',
        ),
        (
            "@daily",
            {"timezone": '"../../etc/passwd"'},
            '[schedule "s"].timezone: expected an IANA time zone',
        ),
        (
            "@daily",
            {"timezone": "1"},
            '[schedule "s"].timezone: expected an IANA time zone such as "UTC", got 1',
        ),
        (
            "@daily",
            {"catch_up": '"some"'},
            '[schedule "s"].catch_up: expected one of "none", "latest", "all", got "some"',
        ),
        (
            "@daily",
            {"max_catch_up": "0"},
            '[schedule "s"].max_catch_up: expected an integer >= 1, got 0',
        ),
        ("@daily", {"args": '"x"'}, '[schedule "s"].args: expected a list, got "x"'),
        ("@daily", {"kwargs": "[]"}, '[schedule "s"].kwargs: expected a table, got []'),
        (
            "@daily",
            {"args": "[1979-05-27]"},
            '[schedule "s"].args: must be JSON values (TOML dates, times, inf and nan are not)',
        ),
        ("@daily", {"kwargs": "{ x = nan }"}, '[schedule "s"].kwargs: must be JSON values'),
    ],
)
def test_schedule_error_messages(tmp_path, cron, extra, expected):
    assert error(tmp_path, schedule(cron, **extra)).startswith(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[[schedule]]\ncron = "@daily"\nqueue = "q"\ntask = "t"\n',
            "[schedule 1]: missing required key name",
        ),
        (
            '[[schedule]]\nname = "n"\nqueue = "q"\ntask = "t"\n',
            '[schedule "n"]: missing required key cron',
        ),
        (
            '[[schedule]]\nname = "n"\ncron = "@daily"\ntask = "t"\n',
            '[schedule "n"]: missing required key queue',
        ),
        (
            '[[schedule]]\nname = "n"\ncron = "@daily"\nqueue = "q"\n',
            '[schedule "n"]: missing required key task',
        ),
        (
            '[[schedule]]\nname = "n"\ncron = "@daily"\nqueue = "q"\ntask = ""\n',
            '[schedule "n"].task: expected a task name, got ""',
        ),
        (
            '[[schedule]]\nname = "n"\ncron = "@daily"\nqueue = "a b"\ntask = "t"\n',
            '[schedule "n"].queue: expected a name',
        ),
        (
            '[[schedule]]\nname = "n"\ncron = 5\nqueue = "q"\ntask = "t"\n',
            '[schedule "n"].cron: expected a cron expression such as "0 3 * * *", got 5',
        ),
        (
            '[[schedule]]\nname = "n"\ncron = "@daily"\nqueue = "q"\ntask = "t"\n' * 2,
            '[schedule "n"].name: duplicate schedule "n"',
        ),
    ],
)
def test_schedule_structure_errors(tmp_path, text, expected):
    assert error(tmp_path, QUEUE + text).startswith(expected)


def test_error_message_uses_the_path_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "forq.toml").write_text('[supervisor]\nlease_tll = "1s"\n' + QUEUE)
    with pytest.raises(ConfigError) as info:
        load_config("etc/forq.toml", env={})
    assert (
        str(info.value)
        == "etc/forq.toml: unknown key [supervisor].lease_tll (did you mean lease_ttl?)"
    )


# -- check_config_main ---------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("FORQ_REDIS_URL", raising=False)
    monkeypatch.delenv("FORQ_REDIS_PASSWORD", raising=False)


def test_check_ok(tmp_path, capsys, clean_env):
    path = write(
        tmp_path, QUEUE + QUEUE.replace('"q"', '"r"') + schedule("@daily").replace(QUEUE, "")
    )
    assert check_config_main(str(path)) == 0
    out, err = capsys.readouterr()
    assert out == f"ok: {path} (2 queues, 1 schedules)\n"
    assert err == ""


def test_check_reads_the_environment(tmp_path, capsys, monkeypatch, clean_env):
    path = write(tmp_path, QUEUE)
    monkeypatch.setenv("FORQ_REDIS_URL", "ftp://nope")
    assert check_config_main(str(path)) == 2
    assert "FORQ_REDIS_URL: expected a URL" in capsys.readouterr().err


def test_check_bad_config(tmp_path, capsys, clean_env):
    path = write(tmp_path, QUEUE + 'concurrency = "four"\n')
    # a duplicate key is a TOML error, reported with its line
    assert check_config_main(str(path)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"{path}: invalid TOML: ")
    assert "line 4" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_check_invalid_value(tmp_path, capsys, clean_env):
    path = write(tmp_path, '[[queue]]\nname = "q"\nconcurrency = "four"\n')
    assert check_config_main(str(path)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f'{path}: [queue 1].concurrency: expected an integer >= 1, got "four"\n'


def test_check_missing_file(tmp_path, capsys, clean_env):
    path = tmp_path / "nope.toml"
    assert check_config_main(str(path)) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"missing file {path}\n")


def test_sandbox_keys_and_their_mistakes(tmp_path):
    queue = '[[queue]]\nname = "q"\nconcurrency = 1\nnetwork = "none"\n'
    config = load(tmp_path, queue + """
[sandbox]
namespaces = true
private_tmp = true
tmp_size = "16MiB"
max_processes = 32
max_output_bytes = "4KiB"
require = ["namespaces", "network"]
[sandbox.tasks."a.b"]
network = "host"
""")
    sb = config.sandbox
    assert (sb.namespaces, sb.private_tmp, sb.tmp_size, sb.max_processes) == (True, True,
                                                                             16 << 20, 32)
    assert (sb.max_output_bytes, sb.require) == (4096, ("namespaces", "network"))
    assert sb.task_network == {"a.b": "host"} and config.queues[0].network == "none"
    assert error(tmp_path, queue + '[sandbox]\nnetwork = "off"\n').startswith(
        '[sandbox].network: expected one of "host", "none"')
    assert error(tmp_path, queue + '[sandbox]\nrequire = ["magic"]\n') == (
        '[sandbox].require: unknown protection "magic"; expected some of run_as, '
        "scrubbed_env, private_config, namespaces, network, private_tmp, max_processes, "
        "job_processes, shared_memory, job_cgroups")
    assert error(tmp_path, queue + '[sandbox.tasks."x"]\nnetwork = 1\n').startswith(
        '[sandbox.tasks."x"].network: expected')
    assert error(tmp_path, queue + "[sandbox]\nnamespaces = 1\n") == (
        "[sandbox].namespaces: expected true or false, got 1")
