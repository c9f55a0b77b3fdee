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

from forq.supervisor.children.running import RunningChild


def cost_of(child: RunningChild) -> str:
    """"cpu_user_ms,cpu_system_ms,peak_bytes,wall_ms,start_latency_ms" (the latency
    empty when unknown); "" for a job whose child never started."""
    if not child.pid or not child.ended:
        return ""
    latency = ""
    began = child.reader.began
    if type(began) in (int, float) and math.isfinite(began) and child.claimed:
        began = min(max(began, child.started), child.ended)
        latency = str(round((began - child.claimed) * 1000))
    user, system = child.cpu_us
    wall = round((child.ended - child.started) * 1000)
    return f"{user // 1000},{system // 1000},{max(0, child.peak_rss)},{wall},{latency}"
