"""Drain: what SIGTERM and SIGINT mean to a supervisor.

The first signal stops claiming and lets running jobs finish for up to
`drain_timeout`, then stops them (their jobs are released, never lost); a second
signal stops them at once. The supervisor exits when no child is left and every
report has reached Redis — or, if Redis will not take them, a grace period later:
those leases expire and another supervisor reclaims the jobs.
"""

from __future__ import annotations

import logging
import signal
import time

from forq.supervisor.children.spawner import Spawner
from forq.supervisor.children.table import Children
from forq.supervisor.loop.eventloop import EventLoop
from forq.supervisor.loop.sdnotify import Notifier
from forq.supervisor.loop.wakeups import Wakeups

log = logging.getLogger("forq.supervisor")

REPORT_GRACE = 15.0  # after the drain timeout, how long to keep retrying reports to Redis


class Drain:
    def __init__(self, loop: EventLoop, children: Children, spawner: Spawner,
                 wakeups: Wakeups, notifier: Notifier) -> None:
        self.loop = loop
        self.children = children
        self.spawner = spawner
        self.wakeups = wakeups
        self.notifier = notifier
        self.active = False
        self.started = 0.0

    def signal(self, signum: int, timeout: float, status: str) -> None:
        name = signal.Signals(signum).name
        if self.active:
            log.info("%s again: stopping %d job(s) now", name, len(self.children))
            self.children.stop_all("second signal")
            return
        self.active = True
        self.spawner.accepting = False
        self.children.release_held(None, "drain")  # prefetched, never started: back now
        self.started = time.monotonic()
        log.info("%s: draining %d running job(s), up to %.0fs", name, len(self.children), timeout)
        self.notifier.stopping(status)
        self.wakeups.stop()
        self.loop.timers.schedule(timeout, lambda: self.children.stop_all("drain timeout"))

    def finished(self, unreported: int, timeout: float) -> bool:
        """Drained: no child left, and every report sent (or given up on)."""
        if not self.active or self.children:
            return False
        return not unreported or time.monotonic() - self.started > timeout + REPORT_GRACE
