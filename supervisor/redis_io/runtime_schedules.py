"""The schedules added at run time (`forq.schedules`, `forq schedule add`), as this
supervisor runs them beside its config file's.

They live in the ``forq:schedules:runtime`` hash (lua/schedule_define.lua), each the
table a ``[[schedule]]`` entry would be. `refresh` reads the hash's version field (one
HGET, every `forq.schedules.RELOAD_SECONDS`) and reloads the hash only when it changed,
so a change reaches every supervisor within about a second at the cost of one small
read a second. A definition comes from Redis, so it is checked like a config file's
(the same rows): a bad one is skipped with one warning naming it, never a crash; a
paused one is not run; one whose name a config schedule has is not run (the file owns
the name); `max_catch_up` is capped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Collection

import redis

from forq.schedules import MAX_CATCH_UP, MAX_DEFINITION_BYTES, MAX_SCHEDULES
from forq.store.keys import SCHEDULES_RUNTIME
from forq.supervisor.config import fields as read
from forq.supervisor.config.schedules import ScheduleConfig, read_schedule

log = logging.getLogger("forq.scheduler")


class RuntimeSchedules:
    """The run-time schedules this supervisor runs, reloaded when they change."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.version: str | None = None  # the hash's "#version" when last read
        self.schedules: dict[str, ScheduleConfig] = {}  # the ones to run, by name
        self.resumed: dict[str, float] = {}  # name -> when last resumed (Unix s)
        self._warned: set[str] = set()  # what was logged already (once each)

    def refresh(self, config_names: Collection[str]) -> bool:
        """Reload the schedules when their version changed; True when it did."""
        raw = self.client.hget(SCHEDULES_RUNTIME, "#version")
        version = str(raw) if raw is not None else ""
        if version == self.version:
            return False
        found: dict[str, str] = self.client.hgetall(SCHEDULES_RUNTIME)  # type: ignore[assignment]
        self.schedules, self.resumed = self._parse(found, set(config_names))
        self.version = version
        return True

    def _parse(self, found: dict[str, str], config_names: set[str]
               ) -> tuple[dict[str, ScheduleConfig], dict[str, float]]:
        names = sorted(str(k) for k in found if not str(k).startswith("#"))
        if len(names) > MAX_SCHEDULES:
            self._warn(f"max:{len(names)}", "%d run-time schedules, more than %d: running the "
                       "first %d by name", len(names), MAX_SCHEDULES, MAX_SCHEDULES)
            names = names[:MAX_SCHEDULES]
        schedules, resumed = {}, {}
        for name in names:
            if f"#paused:{name}" in found:
                continue
            if name in config_names:
                self._warn(f"shadowed:{name}", 'run-time schedule "%s" is not run: this '
                           "supervisor's config file has a schedule of that name", name)
                continue
            schedule = self._read(name, found[name])
            if schedule is None:
                continue
            schedules[name] = schedule
            try:
                resumed[name] = float(found.get(f"#resumed:{name}") or 0) / 1000
            except ValueError:
                resumed[name] = 0.0
        return schedules, resumed

    def _read(self, name: str, raw: str) -> ScheduleConfig | None:
        where = f'[run-time schedule "{name}"]'
        try:
            if len(raw) > MAX_DEFINITION_BYTES:
                raise read.Invalid(f"{where}: {len(raw)} bytes, over the "
                                   f"{MAX_DEFINITION_BYTES}-byte cap")
            try:
                table = json.loads(raw)
            except (ValueError, RecursionError):
                raise read.Invalid(f"{where}: not JSON") from None
            if not isinstance(table, dict):
                raise read.Invalid(f"{where}: not a JSON object")
            schedule = read_schedule(table, where)
            if schedule.name != name:
                raise read.Invalid(f"{where}.name: {schedule.name!r}, not its own name")
        except read.Invalid as exc:
            self._warn(f"bad:{name}:{hash(raw)}", "%s; skipped", str(exc)[:500])
            return None
        return dataclasses.replace(schedule, max_catch_up=min(schedule.max_catch_up,
                                                              MAX_CATCH_UP))

    def _warn(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)
