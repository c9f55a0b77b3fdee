"""What a finished run of a job cost: the `cost` its report carries to Redis, kept in
the job's record and added to its queue's usage totals (lua/includes/cost.lua).

Every figure is the supervisor's own or the kernel's: CPU time from `wait4` (the fork
server's, of the child and every process of its tree it reaped as their subreaper) or
from the job's cgroup (`cpu.stat`, which also counts what left the tree), the peak of
its memory samples (or its cgroup's memory.peak, or ru_maxrss), wall time on the
supervisor's clock. Only the start latency's end comes from the child (the
monotonic time of its handler's first line, `messages`): it is clamped to the child's
life, so a lying child can only misstate that one figure of its own record.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from forq.supervisor.children.running import RunningChild


class Cost(NamedTuple):
    cpu_user_ms: int
    cpu_system_ms: int
    peak_bytes: int
    wall_ms: int
    start_latency_ms: int | None  # None: not known (it ended before its handler began)

    @property
    def cpu_seconds(self) -> float:
        return (self.cpu_user_ms + self.cpu_system_ms) / 1000

    def field(self) -> str:
        """As the record keeps it: "user_ms,system_ms,peak_bytes,wall_ms,latency_ms"."""
        latency = "" if self.start_latency_ms is None else str(self.start_latency_ms)
        return (f"{self.cpu_user_ms},{self.cpu_system_ms},{self.peak_bytes},{self.wall_ms},"
                f"{latency}")


def measure(child: RunningChild) -> Cost | None:
    """What `child`'s run cost; None for a job whose child never started."""
    if not child.pid or not child.ended:
        return None
    latency = None
    began = said_began(child.reader.began)
    if began is not None and child.claimed:
        began = min(max(began, child.started), child.ended)
        latency = round((began - child.claimed) * 1000)
    user, system = child.cpu_us
    return Cost(user // 1000, system // 1000, max(0, child.peak_rss),
                round((child.ended - child.started) * 1000), latency)


def said_began(began: object) -> float | None:
    """What a child said as its handler's first line, as a finite float; None for
    anything else: not a number (a bool is none here), NaN, an infinity, or an int too
    large for a float (`float()` of it raises)."""
    if type(began) not in (int, float):
        return None
    try:
        value = float(began)  # type: ignore[arg-type]
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def cost_of(child: RunningChild) -> str:
    """`child`'s cost as its report carries it ("" for none)."""
    cost = measure(child)
    return cost.field() if cost is not None else ""
