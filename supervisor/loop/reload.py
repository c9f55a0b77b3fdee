"""Reload: what SIGHUP (`systemctl reload`) does to a supervisor — new config, new code.

The config file is read again, and a new fork server always starts and imports the
handler modules afresh from disk (`Spawner.replace`): the jobs started once it is up
run the new code, the running ones finish in the old fork server, which stops with its
last child. The supervisor goes on serving while the new one imports; the new config
applies when it is up (its task table may name new tasks), and systemd hears
RELOADING=1 at the signal and READY=1 then. A config that does not load, or new code
that does not import, is refused: one log line, the old config and code go on, and the
heartbeat says so (`error`, shown by `forq supervisors`) until a reload applies.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from forq.supervisor.children.launch import Launcher
from forq.supervisor.config.load import Config, ConfigError, load_config
from forq.supervisor.config.redis_table import keep_redis_url
from forq.supervisor.fork.client import ForkServerError, ForkServerFatal
from forq.supervisor.observe import tracing

if TYPE_CHECKING:
    from forq.supervisor.supervisor import Supervisor

log = logging.getLogger("forq.supervisor")


class Reload:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        # the last reload refused (at, error, module), for `forq supervisors`; None once
        # one applies
        self.error: dict[str, Any] | None = None

    def signal(self) -> None:
        """SIGHUP: systemd hears RELOADING=1 now and READY=1 once the new config applies
        or was refused."""
        self.sup.notifier.reloading()
        if not self._start():
            self.sup.notifier.ready(self.sup.heartbeat.status())

    def _start(self) -> bool:
        """Load the config and have a new fork server start: True when it is starting
        (`_done` follows), False when the reload was refused at once."""
        sup = self.sup
        try:
            config = load_config(sup.config.path)
        except ConfigError as exc:
            log.error("reload refused, keeping the old config: %s", exc)
            self._refused(str(exc))
            return False
        config = keep_redis_url(sup.config, config)
        before = sup.code()
        sup.spawner.replace(config.fork_server, Launcher.fork_server_launch(config),
                            lambda error: self._done(config, before, error))
        return True

    def _done(self, config: Config, before: str, error: ForkServerError | None) -> None:
        try:
            if error is None:
                self._apply(config, before)
                return
            why = " ".join(str(error).split())  # one line, whatever the module raised
            module = error.module if isinstance(error, ForkServerFatal) else ""
            log.error("reload refused, keeping the old config and code %s: the new fork "
                      "server did not start: %s%s", before or "(unknown)", why,
                      renamed_hint(module))
            self._refused(why, module)
        finally:
            self.sup.notifier.ready(self.sup.heartbeat.status())

    def _apply(self, config: Config, before: str) -> None:
        sup = self.sup
        sup.apply_config(config)
        try:
            tracing.configure(config.tracing)
        except tracing.TracingUnavailable as exc:
            log.error("reload: %s; job spans off", exc)
        sup.scheduler.replace(config.schedules)
        sup.push_limits()
        if not sup.drain.active:
            sup.wakeups.subscribe(sup.served())
        sup.want_claim = True
        self.error = None
        if sup.code() != before:
            # leased ahead of a slot under the old code, never started: back to the queue,
            # to be claimed again (and recorded) under the new one
            sup.children.release_held(None, "reload: new handler code")
        log.info("reloaded %s: queues %s; code %s", config.path,
                 ", ".join(f"{q.name}×{q.concurrency}" for q in config.queues),
                 sup.code() or "(unknown)")
        sup.heartbeat.beat()  # `forq supervisors` shows the new code now

    def _refused(self, why: str, module: str = "") -> None:
        self.error = {"at": time.time(), "error": why[:1000], "module": module[:300]}
        self.sup.heartbeat.beat()


def renamed_hint(module: str) -> str:
    """What an import of one of forq's old top-level names (before 0.2) is called now."""
    top = module.split(".", 1)[0]
    if top in ("jobs", "supervisor", "forq_lua"):
        new = {"jobs": "forq", "supervisor": "forq.supervisor", "forq_lua": "forq.lua"}[top]
        return (f" (forq installs one package, `forq`, since 0.2: `{top}` is now `{new}`, "
                f"e.g. jobs.examples is forq.examples; see the README, \"Upgrading\")")
    return ""
