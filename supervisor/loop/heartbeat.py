"""Heartbeat: what a supervisor says about itself, every couple of seconds.

The status line (systemd's `Status:`, and READY/RELOADING/STOPPING messages), the
process title (`ps` shows busy/slots), idle /metrics connections swept, and its record
in the roster of live supervisors (what `forq supervisors` and the dashboard read: one
write per beat, whatever the job rate), with the handler code it serves (`code_record`). It reads the supervisor's state
and changes none of it.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any

import redis

from forq.supervisor.loop import status
from forq.supervisor.redis_io.roster import running_record

if TYPE_CHECKING:
    from forq.supervisor.supervisor import Supervisor

INTERVAL = 2.0


class Heartbeat:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def slots(self) -> int:
        return sum(q.concurrency for q in self.sup.config.queues)

    def status(self) -> str:
        return status.status_line(self.sup.drain.active, len(self.sup.children), self.slots())

    def set_title(self) -> None:
        status.set_title(self.sup.name, len(self.sup.children), self.slots())

    def beat(self) -> None:
        sup = self.sup
        sup.settings.register()
        sup.notifier.status(self.status())
        self.set_title()
        if sup.metrics_server is not None:
            sup.metrics_server.sweep()
        if not sup.health.ready():
            return
        try:
            sup.roster.beat({
                "name": sup.name, "host": socket.gethostname(), "pid": os.getpid(),
                "queues": [qc.name for qc in sup.config.queues], "busy": len(sup.children),
                "slots": self.slots(), "draining": sup.drain.active,
                **code_record(sup), **sup.children.budget.record(time.monotonic()),
                **running_record(sup.children, sup.leases, per_job_cgroups=bool(
                    sup.launcher.cgroups and not sup.launcher.cgroups_failed),
                    held=sup.children.held.ids()),
            })
        except (redis.RedisError, OSError) as exc:
            sup.health.failed("heartbeat", exc)


def code_record(sup: Supervisor) -> dict[str, Any]:
    """The handler code in the heartbeat record: what jobs started now run (`code`), each
    old fork server still finishing jobs in older code (`code_retiring`: code, pid,
    jobs), and the last reload refused (`reload_error`: at, error, module), if any."""
    record: dict[str, Any] = {"code": sup.code(), "code_retiring": [
        {"code": code, "pid": pid, "jobs": jobs}
        for pid, code, jobs in sup.spawner.retiring_codes()]}
    if sup.reloads.error is not None:
        record["reload_error"] = sup.reloads.error
    return record
