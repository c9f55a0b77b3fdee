"""Schedules at run time (issue 29 item 7): forq.schedules, lua/schedule_define.lua and
schedule_fired.lua, the supervisor's RuntimeSchedules and overlap = "skip"; through the
API, the asyncio API, the CLI, the scheduler with the clock in hand, and real
supervisors (each tick once across them, a change picked up within a second or two).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as redis_lib

from forq import Queue
from forq.schedules import (
    AsyncSchedules,
    ScheduleError,
    ScheduleNotFound,
    Schedules,
    definition,
)
from forq.store import cron
from forq.store.keys import SCHEDULE_DEFS, SCHEDULES, SCHEDULES_RUNTIME
from forq.store.scripts import Scripts
from forq.supervisor.config.schedules import ScheduleConfig
from forq.supervisor.redis_io.scheduler import Scheduler
from tests.helpers import wait_for
from tests.supervisors import REPO, SupervisorProcess, write_config

UTC = dt.timezone.utc


@pytest.fixture
def name(r: redis_lib.Redis) -> Iterator[str]:
    """A fresh schedule name; its run-time definition, record and published entry go."""
    made = f"t-{uuid.uuid4().hex[:10]}"
    yield made
    r.hdel(SCHEDULES_RUNTIME, made, f"#paused:{made}", f"#resumed:{made}")
    r.hdel(SCHEDULES, made)
    r.hdel(SCHEDULE_DEFS, made)


@pytest.fixture
def schedules(r: redis_lib.Redis) -> Schedules:
    return Schedules(r)


def publish_config(r: redis_lib.Redis, name: str, queue: str, **extra) -> None:
    """What a supervisor whose config file has schedule `name` publishes."""
    seconds, _ = r.time()
    r.hset(SCHEDULE_DEFS, name, json.dumps({
        "cron": "@hourly", "timezone": "UTC", "queue": queue, "task": "t.cfg", "args": [1],
        "kwargs": {}, "overlap": "allow", "source": "config", "next": None, "seen": int(seconds),
        **extra}))


def row(schedules: Schedules, name: str) -> dict:
    return next(r for r in schedules.list() if r["name"] == name)


# -- the API ------------------------------------------------------------------------------


def test_add_list_replace_remove(schedules: Schedules, name: str, queue: Queue):
    assert schedules.add(name, "@every 30s", queue=queue.name, task="t.tick",
                         args=[1], kwargs={"a": 2}, overlap="skip") == "added"
    found = row(schedules, name)
    assert (found["source"], found["overlap"], found["paused"], found["queue"]) == (
        "runtime", "skip", False, queue.name)
    assert found["next_fire"] % 30 == 0 and found["next_fire"] > time.time() - 1
    with pytest.raises(ScheduleError, match="exists already"):
        schedules.add(name, "@hourly", queue=queue.name, task="t.tick")
    assert schedules.add(name, "@hourly", queue=queue.name, task="t.other",
                         replace=True) == "replaced"
    assert row(schedules, name)["task"] == "t.other"
    schedules.remove(name)
    assert all(r["name"] != name for r in schedules.list())
    with pytest.raises(ScheduleNotFound, match=f"no run-time schedule named '{name}'"):
        schedules.remove(name)


def test_pause_and_resume(schedules: Schedules, name: str, queue: Queue, r: redis_lib.Redis):
    schedules.add(name, "@hourly", queue=queue.name, task="t.tick")
    version = int(r.hget(SCHEDULES_RUNTIME, "#version"))
    assert schedules.pause(name) is True and schedules.pause(name) is False
    found = row(schedules, name)
    assert found["paused"] and found["next_fire"] is None
    assert schedules.resume(name) is True and schedules.resume(name) is False
    assert not row(schedules, name)["paused"] and r.hget(SCHEDULES_RUNTIME, f"#resumed:{name}")
    assert int(r.hget(SCHEDULES_RUNTIME, "#version")) == version + 2  # unchanged: no bump
    for change in (schedules.pause, schedules.resume):
        with pytest.raises(ScheduleNotFound):
            change("nope-" + name)


def test_a_config_file_owns_its_schedule(schedules: Schedules, name: str, queue: Queue):
    publish_config(schedules.redis, name, queue.name)
    with pytest.raises(ScheduleError, match="defined in a supervisor's config file"):
        schedules.add(name, "@hourly", queue=queue.name, task="t.tick")
    for change in (schedules.remove, schedules.pause, schedules.resume):
        with pytest.raises(ScheduleError, match="config file, which owns it"):
            change(name)
    found = row(schedules, name)
    assert found["source"] == "config" and not found["shadows"]


@pytest.mark.parametrize("kwargs, needle", [
    ({"name": "bad name"}, "schedule name must be"),
    ({"name": "#version"}, "schedule name must be"),
    ({"name": "x" * 201}, "schedule name must be"),
    ({"cron": "61 * * * *"}, "valid cron expression"),
    ({"cron": "@sometimes"}, "one of @annually"),
    ({"cron": "@every soon"}, "@every"),
    ({"cron": "@every 0s"}, "more than 0"),
    ({"cron": "0 0 30 2 *"}, "cron expression"),
    ({"cron": 5}, "cron must be a string"),
    ({"timezone": "Mars/Olympus"}, "IANA time zone"),
    ({"queue": "a{b}"}, "queue must be a queue name"),
    ({"task": ""}, "task must be a task name"),
    ({"catch_up": "some"}, "catch_up must be one of"),
    ({"overlap": "queue"}, "overlap must be one of"),
    ({"max_catch_up": 0}, "max_catch_up must be an integer from 1 to 1000"),
    ({"max_catch_up": True}, "max_catch_up"),
    ({"max_catch_up": 10 ** 9}, "max_catch_up"),
    ({"args": [{1, 2}]}, "not JSON-serialisable"),
    ({"args": ["x" * 70_000]}, "over the 65536-byte limit"),
    ({"args": "abc"}, "args must be a list"),
])
def test_a_bad_definition_is_refused_naming_the_key(kwargs, needle):
    given = {"name": "ok", "cron": "@hourly", "queue": "q", "task": "t", **kwargs}
    with pytest.raises(ScheduleError, match=needle):
        definition(given.pop("name"), given.pop("cron"), **given)


def test_a_version_that_is_not_a_number_goes_on_from_the_clock(schedules, name, queue, r):
    before = r.hget(SCHEDULES_RUNTIME, "#version")
    try:
        r.hset(SCHEDULES_RUNTIME, "#version", "garbage")
        schedules.add(name, "@hourly", queue=queue.name, task="t")
        assert int(r.hget(SCHEDULES_RUNTIME, "#version")) > 1_600_000_000_000  # from the clock
        s = scheduler(r)
        assert s.refresh_runtime() and name in s.runtime.schedules
    finally:
        if before is None:
            r.hdel(SCHEDULES_RUNTIME, "#version")


def test_the_number_of_run_time_schedules_is_capped(schedules: Schedules, name: str,
                                                    r: redis_lib.Redis, queue: Queue,
                                                    monkeypatch: pytest.MonkeyPatch):
    import forq.schedules as module

    existing = len([k for k in r.hkeys(SCHEDULES_RUNTIME) if not k.startswith("#")])
    monkeypatch.setattr(module, "MAX_SCHEDULES", existing)
    with pytest.raises(ScheduleError, match="remove one first"):
        schedules.add(name, "@hourly", queue=queue.name, task="t")


# -- the record (lua/schedule_fired.lua) --------------------------------------------------


def test_the_record_never_goes_back_and_keeps_the_last_job(r: redis_lib.Redis, name: str):
    scripts = Scripts(r)

    def fired(mode, tick, job=""):
        return scripts.run(cron.schedule_fired_call(name, mode, tick, job))

    def record():
        return json.loads(r.hget(SCHEDULES, name))

    assert fired("tick", 100.5, "j1") == 1
    assert record() == {"last": 100.5, "job": "j1"}
    assert fired("tick", 100.5, "j1") == 0 and fired("tick", 50, "old") == 0
    assert fired("skip", 200) == 1 and record() == {"last": 200, "job": "j1", "skipped": 200}
    assert fired("trigger", None, "manual") == 1
    assert record() == {"last": 200, "job": "manual", "skipped": 200}
    assert fired("tick", 1712345678.125, "j2") == 1
    assert record()["last"] == 1712345678.125
    r.hset(SCHEDULES, name, "300")  # an older forq's record: the tick alone
    assert fired("tick", 250, "x") == 0 and fired("tick", 400, "j3") == 1
    r.hset(SCHEDULES, name, "{not json")  # garbage: started afresh
    assert fired("trigger", None, "j4") == 1 and record() == {"last": None, "job": "j4"}


# -- trigger ------------------------------------------------------------------------------


def test_trigger_enqueues_once_and_overlap_skip_waits_for_the_last_job(
        schedules: Schedules, name: str, queue: Queue):
    schedules.add(name, "@yearly", queue=queue.name, task="t.tick", args=[7], overlap="skip")
    first = schedules.trigger(name)
    job = queue.get(first.job_id)
    assert (job.state, job.task, job.args) == ("pending", "t.tick", [7])
    assert row(schedules, name)["last_job"] == first.job_id
    second = schedules.trigger(name)
    assert (second.job_id, second.skipped_for, second.skipped_state) == (
        None, first.job_id, "pending")
    forced = schedules.trigger(name, force=True)
    assert forced.job_id not in (None, first.job_id)
    queue.cancel(first.job_id)
    queue.cancel(forced.job_id)
    assert schedules.trigger(name).job_id is not None


def test_trigger_a_config_schedule_from_what_its_supervisor_published(
        schedules: Schedules, name: str, queue: Queue, r: redis_lib.Redis):
    publish_config(r, name, queue.name)
    done = schedules.trigger(name)
    assert queue.get(done.job_id).args == [1]
    r.hset(SCHEDULE_DEFS, name, json.dumps({"cron": "@hourly", "queue": queue.name,
                                            "task": "t", "seen": time.time()}))
    with pytest.raises(ScheduleError, match="older supervisor"):
        schedules.trigger(name)
    with pytest.raises(ScheduleNotFound):
        schedules.trigger("nope-" + name)


# -- the scheduler, with the clock in hand -------------------------------------------------


def scheduler(r: redis_lib.Redis, config: list[ScheduleConfig] | None = None) -> Scheduler:
    return Scheduler(config or [], r, lambda q: Queue(q, redis=r))


def tick_jobs(r: redis_lib.Redis, queue: Queue, name: str) -> dict[int, int]:
    """Jobs per tick of schedule `name` on `queue`, from their idempotency keys."""
    out: dict[int, int] = {}
    prefix = f"schedule:{name}:"
    for job_id in r.zrange(queue.keys.pending, 0, -1):
        key = r.hget(queue.keys.job(job_id), "key") or ""
        if key.startswith(prefix):
            tick = int(key[len(prefix):])
            out[tick] = out.get(tick, 0) + 1
    return out


def test_two_schedulers_fire_each_run_time_tick_once(r, name, queue, schedules):
    schedules.add(name, "@every 1s", queue=queue.name, task="t.tick", catch_up="none")
    a, b = scheduler(r), scheduler(r)
    assert a.refresh_runtime() and b.refresh_runtime()
    assert not a.refresh_runtime()  # nothing changed: one HGET
    start = dt.datetime.fromtimestamp(int(time.time()) + 5, UTC)
    for s in (a, b):  # first look: positions after `start`
        s.fire_due(now=start)
    for step in range(1, 4):
        for s in (a, b):
            s.fire_due(now=start + dt.timedelta(seconds=step, milliseconds=100))
    ticks = tick_jobs(r, queue, name)
    assert sorted(ticks) == [int(start.timestamp() * 1000) + 1000 * i for i in (1, 2, 3)]
    assert set(ticks.values()) == {1}


def test_paused_is_not_fired_and_resumed_does_not_catch_up(r, name, queue, schedules):
    schedules.add(name, "@every 1s", queue=queue.name, task="t.tick", catch_up="all")
    s = scheduler(r)
    s.refresh_runtime()
    start = dt.datetime.now(UTC)
    s.fire_due(now=start)
    schedules.pause(name)
    assert s.refresh_runtime() and s.runtime.schedules == {}
    s.fire_due(now=start + dt.timedelta(seconds=3))
    assert tick_jobs(r, queue, name) == {}
    schedules.resume(name)
    assert s.refresh_runtime()
    later = dt.datetime.now(UTC) + dt.timedelta(seconds=1, milliseconds=100)
    s.fire_due(now=later)
    # only ticks after the resume: none of the paused seconds is caught up
    assert len(tick_jobs(r, queue, name)) <= 2
    resumed = int(r.hget(SCHEDULES_RUNTIME, f"#resumed:{name}"))
    assert all(t > resumed - 1000 for t in tick_jobs(r, queue, name))


def test_overlap_skip_skips_ticks_while_the_last_job_is_live(r, name, queue, schedules):
    schedules.add(name, "@every 1s", queue=queue.name, task="t.tick", catch_up="all",
                  overlap="skip")
    s = scheduler(r)
    s.refresh_runtime()
    start = dt.datetime.fromtimestamp(int(time.time()) + 5, UTC)
    s.fire_due(now=start)
    s.fire_due(now=start + dt.timedelta(seconds=3, milliseconds=100))  # 3 ticks due
    ticks = tick_jobs(r, queue, name)
    assert len(ticks) == 1  # the first fired, the next two skipped: it is pending
    record = json.loads(r.hget(SCHEDULES, name))
    assert record["skipped"] == record["last"] == start.timestamp() + 3
    (job_id,) = r.zrange(queue.keys.pending, 0, -1)
    queue.cancel(job_id)
    s.fire_due(now=start + dt.timedelta(seconds=4, milliseconds=100))
    assert len(tick_jobs(r, queue, name)) == 1 and r.zcard(queue.keys.pending) == 1


def test_config_schedule_with_overlap_skip(r, queue, name):
    config = ScheduleConfig(name=name, cron="@every 1s", queue=queue.name, task="t.tick",
                            catch_up="all", overlap="skip", every=1.0)
    s = scheduler(r, [config])
    start = dt.datetime.fromtimestamp(int(time.time()) + 5, UTC)
    s.fire_due(now=start)
    s.fire_due(now=start + dt.timedelta(seconds=2, milliseconds=100))
    assert len(tick_jobs(r, queue, name)) == 1
    published = json.loads(r.hget(SCHEDULE_DEFS, name))
    assert (published["source"], published["overlap"], published["args"]) == ("config", "skip", [])


def test_a_hostile_definition_in_redis_is_skipped_with_one_warning(r, name, queue, schedules,
                                                                   caplog):
    schedules.add(name, "@every 1s", queue=queue.name, task="t.tick")
    bad = [f"{name}-{i}" for i in range(6)]
    try:
        r.hset(SCHEDULES_RUNTIME, mapping={
            bad[0]: "{not json", bad[1]: "[1, 2]", bad[2]: json.dumps({"name": bad[2]}),
            bad[3]: json.dumps({"name": "other", "cron": "@hourly", "queue": "q", "task": "t"}),
            bad[4]: json.dumps({"name": bad[4], "cron": "@hourly", "queue": "a b", "task": "t"}),
            bad[5]: "x" * 70_000})
        r.hincrby(SCHEDULES_RUNTIME, "#version", 1)
        s = scheduler(r)
        with caplog.at_level(logging.WARNING, logger="forq.scheduler"):
            assert s.refresh_runtime()
            s.runtime.version = None
            s.refresh_runtime()  # reloaded: the same problems are not logged again
        assert name in s.runtime.schedules and not set(bad) & set(s.runtime.schedules)
        warned = [rec.getMessage() for rec in caplog.records]
        assert len(warned) == len(bad), warned
        assert any("not JSON" in w for w in warned) and any("not its own name" in w for w in warned)
        assert all(len(w) < 700 for w in warned)
    finally:
        r.hdel(SCHEDULES_RUNTIME, *bad)


def test_a_config_schedule_shadows_a_run_time_one_of_its_name(r, name, queue, schedules):
    schedules.add(name, "@every 1s", queue=queue.name, task="t.runtime")
    config = ScheduleConfig(name=name, cron="@hourly", queue=queue.name, task="t.config")
    s = scheduler(r, [config])
    s.refresh_runtime()
    assert [x.task for x in s.schedules] == ["t.config"]
    s.fire_due()
    assert row(schedules, name)["source"] == "config" and row(schedules, name)["shadows"]


def test_max_catch_up_of_a_run_time_schedule_is_capped(r, name, queue):
    r.hset(SCHEDULES_RUNTIME, name, json.dumps({
        "name": name, "cron": "@every 1s", "queue": queue.name, "task": "t",
        "catch_up": "all", "max_catch_up": 10 ** 9}))
    r.hincrby(SCHEDULES_RUNTIME, "#version", 1)
    s = scheduler(r)
    s.refresh_runtime()
    assert s.runtime.schedules[name].max_catch_up == 1000


# -- asyncio ------------------------------------------------------------------------------


def test_async_schedules(redis_url: str, name: str, queue: Queue):
    from forq import AsyncQueue

    async def main() -> None:
        async with AsyncQueue(queue.name, url=redis_url) as aq:
            s = AsyncSchedules(aq.redis)
            assert await s.add(name, "@hourly", queue=queue.name, task="t.tick",
                               overlap="skip") == "added"
            assert await s.pause(name) and await s.resume(name)
            done = await s.trigger(name)
            assert done.job_id and (await s.trigger(name)).skipped_for == done.job_id
            assert any(r["name"] == name for r in await s.list())
            await s.remove(name)
            with pytest.raises(ScheduleNotFound):
                await s.remove(name)

    asyncio.run(main())


# -- the CLI ------------------------------------------------------------------------------


def forq(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url,
                           *args], capture_output=True, text=True, timeout=30, cwd=REPO)


def test_cli_schedule_commands(redis_url: str, name: str, queue: Queue):
    done = forq(redis_url, "schedule", "add", name, "--cron", "0 3 * * *", "--queue",
                queue.name, "--task", "t.nightly", "--args", "[1]", "--overlap", "skip",
                "--timezone", "Europe/Paris")
    assert done.returncode == 0 and f"added schedule {name}" in done.stdout, done.stderr
    listed = json.loads(forq(redis_url, "schedule", "list", "--json").stdout)
    mine = next(r for r in listed if r["name"] == name)
    assert (mine["source"], mine["overlap"], mine["timezone"]) == ("runtime", "skip",
                                                                   "Europe/Paris")
    text = forq(redis_url, "schedule", "list").stdout
    assert any(line.startswith(name) and "run-time" in line for line in text.splitlines())
    assert "paused schedule" in forq(redis_url, "schedule", "pause", name).stdout
    assert "run-time, paused" in forq(redis_url, "schedules").stdout
    assert "resumed schedule" in forq(redis_url, "schedule", "resume", name).stdout
    triggered = json.loads(forq(redis_url, "schedule", "trigger", name, "--json").stdout)
    assert queue.get(triggered["job_id"]).args == [1]
    skipped = forq(redis_url, "schedule", "trigger", name)
    assert "not triggered" in skipped.stdout and "--force" in skipped.stdout
    assert forq(redis_url, "schedule", "remove", name).returncode == 0
    gone = forq(redis_url, "schedule", "remove", name)
    assert gone.returncode == 1 and "no run-time schedule" in gone.stderr


@pytest.mark.parametrize("argv, code, needle", [
    (["add", "n", "--cron", "61 * * * *", "--queue", "q", "--task", "t"], 2, "valid cron"),
    (["add", "n", "--cron", "@daily", "--queue", "q", "--task", "t", "--args", "{"], 2,
     "--args is not valid JSON"),
    (["add", "bad name", "--cron", "@daily", "--queue", "q", "--task", "t"], 2,
     "schedule name must be"),
    (["add", "n", "--cron", "@daily", "--queue", "q", "--task", "t", "--overlap", "x"], 2,
     "invalid choice"),
    (["pause", "no-such-schedule-here"], 1, "no run-time schedule"),
    (["trigger", "no-such-schedule-here"], 1, "no schedule named"),
])
def test_cli_bad_input_is_one_line(redis_url: str, argv, code, needle):
    done = forq(redis_url, "schedule", *argv)
    assert done.returncode == code and "Traceback" not in done.stderr
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1


# -- real supervisors ---------------------------------------------------------------------


def unchanged_for(seconds: float, count: Callable[[], int]) -> int:
    """`count()` stays the same for `seconds` (polled): nothing happens meanwhile."""
    first = count()
    deadline = time.monotonic() + seconds
    wait_for(lambda: count() != first or time.monotonic() > deadline, timeout=seconds + 5,
             interval=0.1, message=f"{seconds}s to pass")
    assert count() == first, f"changed from {first} to {count()} within {seconds}s"
    return first


def test_supervisors_run_a_run_time_schedule_each_tick_once_and_follow_pause_and_remove(
        tmp_path: Path, redis_url: str, r: redis_lib.Redis, name: str, queue: Queue,
        schedules: Schedules):
    served = f"{queue.name}-idle"  # what they serve: not the schedule's queue

    def ticks() -> int:
        return len(tick_jobs(r, queue, name))

    with contextlib.ExitStack() as stack:
        sups = [stack.enter_context(SupervisorProcess(write_config(
            tmp_path / f"s{i}.toml", redis_url, {served: 1})).start()) for i in range(2)]
        added = time.monotonic()
        schedules.add(name, "@every 1s", queue=queue.name, task="tests.echo", catch_up="none")
        try:
            wait_for(ticks, timeout=10, interval=0.05, message="the added schedule's first tick")
        except AssertionError:
            raise AssertionError("\n".join(s.log()[-2000:] for s in sups)) from None
        # picked up within RELOAD_SECONDS, then its next tick (at most 1 s later)
        assert time.monotonic() - added < 1 + 1 + 1.5
        wait_for(lambda: ticks() >= 3, timeout=10, interval=0.1, message="three ticks")

        def reached_both() -> None:
            version = r.hget(SCHEDULES_RUNTIME, "#version")
            wait_for(lambda: all(f"(version {version})" in s.log() for s in sups), timeout=5,
                     interval=0.05, message=f"both supervisors at version {version}")

        schedules.pause(name)
        reached_both()
        paused = unchanged_for(2.0, ticks)
        schedules.resume(name)
        wait_for(lambda: ticks() > paused, timeout=10, interval=0.1, message="ticks again")
        schedules.remove(name)
        reached_both()
        unchanged_for(2.0, ticks)
    counts = tick_jobs(r, queue, name)
    assert set(counts.values()) == {1}, counts  # each tick once across both supervisors
