"""Cron schedules fired by every supervisor that has them, each tick exactly once.

There is no leader. Every supervisor computes the same tick times (cron by cronsim,
``@every`` anchored at the epoch) and enqueues each due tick with the idempotency key
``schedule:<name>:<tick>``, checked inside the enqueue script: the first enqueue of a
tick wins, the others get "duplicate" and add nothing. The last fired tick is kept in
the ``forq:schedules`` hash for catch-up after downtime and for `forq schedules`.

Each supervisor also publishes the definitions of its config file, with their next
tick, in ``forq:schedules:defs`` (at every pass, at least once a minute), so `forq
schedules` and `forq web` show them from any machine without the supervisor's config
file, and `forq schedule trigger` can run one.

Beside its config's, every supervisor runs the schedules added at run time
(`RuntimeSchedules`, reloaded within `forq.schedules.RELOAD_SECONDS` of a change).
``overlap = "skip"``: before a tick is enqueued, the job of the last tick (or of the
last trigger), named in the schedule's record, is looked up; while it is pending,
scheduled, waiting or running, the tick is skipped (recorded as such, so it is not
caught up later). Which supervisor looks does not matter: the tick is fired (by its
key) or skipped, never fired twice.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from forq import Queue
from forq.schedules import LIVE, RELOAD_SECONDS
from forq.store import cron
from forq.store.keys import SCHEDULE_DEFS, SCHEDULES
from forq.supervisor.config.load import ScheduleConfig
from forq.supervisor.loop.timers import Timers
from forq.supervisor.redis_io.health import RedisHealth
from forq.supervisor.redis_io.runtime_schedules import RuntimeSchedules

log = logging.getLogger("forq.scheduler")

LATE_GRACE = dt.timedelta(seconds=5)  # a tick this late still fires under catch_up="none"
MAX_SCAN = 100_000  # ticks walked to find missed ones, bounding a very long downtime


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def tick_key(schedule: ScheduleConfig, tick: dt.datetime) -> str:
    return f"schedule:{schedule.name}:{int(tick.timestamp() * 1000)}"


def _keep_key_for(schedule: ScheduleConfig, tick: dt.datetime) -> float:
    """Seconds the tick's key outlives its job: long enough that no supervisor, however
    late or behind on catch-up, fires the tick again."""
    period = (schedule.next_after(tick) - tick).total_seconds()
    return min(7 * 86400, max(600.0, period * (schedule.max_catch_up + 2)))


class Scheduler:
    def __init__(self, schedules: list[ScheduleConfig], client: redis.Redis,
                 queue_for: Callable[[str], Queue]) -> None:
        self.client = client
        self.queue_for = queue_for
        self.config_schedules = list(schedules)
        self.runtime = RuntimeSchedules(client)
        self.next_tick: dict[str, dt.datetime] = {}

    @property
    def schedules(self) -> list[ScheduleConfig]:
        """What this supervisor runs: its config's, then the run-time ones."""
        return self.config_schedules + list(self.runtime.schedules.values())

    def replace(self, schedules: list[ScheduleConfig]) -> None:
        """New config (SIGHUP): keep the position of schedules that did not change."""
        old = {s.name: s for s in self.config_schedules}
        self.config_schedules = list(schedules)
        for s in schedules:
            if old.get(s.name) != s:
                self.next_tick.pop(s.name, None)
        self.runtime.version = None  # the config's names decide which run-time ones run

    def refresh_runtime(self) -> bool:
        """Reload the run-time schedules if they changed (one HGET when not); a schedule
        that changed, went or was paused starts afresh. True when they changed."""
        before = dict(self.runtime.schedules)
        if not self.runtime.refresh({s.name for s in self.config_schedules}):
            return False
        for name in set(before) | set(self.runtime.schedules):
            if before.get(name) != self.runtime.schedules.get(name):
                self.next_tick.pop(name, None)
        log.info("run-time schedules: %d to run (version %s)", len(self.runtime.schedules),
                 self.runtime.version or "0")
        return True

    def run_on(self, timers: Timers, health: RedisHealth, stopped: Callable[[], bool]) -> None:
        """Fire due ticks now and whenever the next one is due, until `stopped()`, and
        look for changed run-time schedules every RELOAD_SECONDS; after a Redis error,
        try again once `health` allows."""
        next_pass = [0.0]  # monotonic time of the next fire_due

        def run() -> None:
            if stopped():
                return
            if health.ready():
                try:
                    changed = self.refresh_runtime()
                    if changed or time.monotonic() >= next_pass[0]:
                        next_pass[0] = time.monotonic() + self.fire_due()
                except (redis.RedisError, OSError) as exc:
                    health.failed("schedule", exc)
            wait = max(0.0, next_pass[0] - time.monotonic())
            timers.schedule(min(wait, RELOAD_SECONDS) + 0.002, run)

        timers.schedule(0, run)

    def _records(self) -> dict[str, tuple[float | None, str | None]]:
        """Each schedule's record: the last tick fired or skipped, and the last job."""
        raw: dict[str, str] = self.client.hgetall(SCHEDULES)  # type: ignore[assignment]
        out: dict[str, tuple[float | None, str | None]] = {}
        for name, value in raw.items():
            try:
                record = json.loads(value)
            except ValueError:
                continue
            if isinstance(record, (int, float)) and not isinstance(record, bool):
                out[name] = (float(record), None)
            elif isinstance(record, dict):
                last = record.get("last")
                job = record.get("job")
                out[name] = (float(last) if isinstance(last, (int, float)) else None,
                             job if isinstance(job, str) else None)
        return out

    def _due(self, schedule: ScheduleConfig, last: float | None, now: dt.datetime) -> list[dt.datetime]:
        """The ticks to fire now, by the schedule's catch_up policy."""
        if schedule.name not in self.next_tick:
            # first look at this schedule: resume after the last tick anyone fired,
            # or start with the next tick when it has never fired
            if last is None:
                self.next_tick[schedule.name] = schedule.next_after(now)
                return []
            start = dt.datetime.fromtimestamp(last, dt.timezone.utc)
            self.next_tick[schedule.name] = schedule.next_after(start)
        ticks: list[dt.datetime] = []
        tick = self.next_tick[schedule.name]
        scanned = 0
        while tick <= now and scanned < MAX_SCAN:
            ticks.append(tick)
            if len(ticks) > schedule.max_catch_up:
                ticks.pop(0)
            tick = schedule.next_after(tick)
            scanned += 1
        if scanned >= MAX_SCAN:
            tick = schedule.next_after(now)
        self.next_tick[schedule.name] = tick
        if not ticks:
            return []
        if schedule.catch_up == "all":
            return ticks
        if schedule.catch_up == "latest":
            return ticks[-1:]
        # "none": only the current tick (the latest, if at most LATE_GRACE late); the
        # ticks before it were missed, even those that are still less than the grace old
        return [t for t in ticks[-1:] if now - t <= LATE_GRACE]

    def fire_due(self, now: dt.datetime | None = None) -> float:
        """Enqueue every due tick; returns seconds until the next tick (at most 60).
        On a Redis error the ticks stay due and are fired on the next call."""
        now = now or _now()
        records = self._records()
        for schedule in self.schedules:
            before = self.next_tick.get(schedule.name)
            last, last_job = records.get(schedule.name, (None, None))
            resumed = self.runtime.resumed.get(schedule.name)
            if resumed and (last is None or resumed > last):
                last = resumed  # ticks missed while it was paused are not caught up
            ticks = self._due(schedule, last, now)
            try:
                for tick in ticks:
                    last_job = self._fire(schedule, tick, last_job)
            except (redis.RedisError, OSError):
                if before is not None:
                    self.next_tick[schedule.name] = before
                raise
        self._publish()
        if not self.next_tick:
            return 60.0
        soonest = min(self.next_tick.values())
        return max(0.0, min(60.0, (soonest - _now()).total_seconds()))

    def _publish(self) -> None:
        """One HSET of every definition of the config file, with its next tick (run-time
        ones are read from their own hash)."""
        if not self.config_schedules:
            return
        seen = time.time()
        defs: dict[str | bytes, str] = {}
        for s in self.config_schedules:
            nxt = self.next_tick.get(s.name)
            defs[s.name] = json.dumps({
                "cron": s.cron, "timezone": s.timezone, "queue": s.queue, "task": s.task,
                "args": s.args, "kwargs": s.kwargs, "overlap": s.overlap, "source": "config",
                "next": nxt.timestamp() if nxt else None, "seen": seen})
        self.client.hset(SCHEDULE_DEFS, mapping=defs)  # type: ignore[arg-type]

    def _fire(self, schedule: ScheduleConfig, tick: dt.datetime,
              last_job: str | None) -> str | None:
        """Enqueue the tick (or skip it: overlap = "skip" and `last_job` is live);
        returns the schedule's last job now."""
        queue = self.queue_for(schedule.queue)
        stamp = tick.timestamp()
        if schedule.overlap == "skip" and last_job:
            state = self.client.hget(queue.keys.job(last_job), "state")
            if state in LIVE:
                if queue.scripts.run(cron.schedule_fired_call(schedule.name, "skip", stamp)):
                    log.info("schedule %s: skipped tick %s: the last run, job %s, is still %s",
                             schedule.name, tick.isoformat(timespec="seconds"), last_job, state)
                return last_job
        job = queue.enqueue(schedule.task, args=list(schedule.args),
                            kwargs=dict(schedule.kwargs), key=tick_key(schedule, tick),
                            unique_for=_keep_key_for(schedule, tick))
        queue.scripts.run(cron.schedule_fired_call(schedule.name, "tick", stamp, job.id))
        if job.fields.get("enqueue_status") != "duplicate":
            log.info("schedule %s: fired tick %s as job %s", schedule.name,
                     tick.isoformat(timespec="seconds"), job.id)
        return job.id


def config_defs(schedules: Sequence[ScheduleConfig], now: float) -> dict[str, dict[str, Any]]:
    """A config file's schedules as `forq.fleet.schedule_rows` takes them."""
    now_dt = dt.datetime.fromtimestamp(now, dt.timezone.utc)
    defs = {}
    for s in schedules:
        try:
            nxt: float | None = s.next_after(now_dt).timestamp()
        except (StopIteration, ValueError):
            nxt = None
        defs[s.name] = {"cron": s.cron, "timezone": s.timezone, "queue": s.queue,
                        "task": s.task, "overlap": s.overlap, "next": nxt, "seen": now}
    return defs
