"""How the CLI says what a job cost, on one line (`forq job`, `render.job`)."""

from __future__ import annotations

from collections.abc import Mapping

from forq import Job
from forq.units import format_size


def cost_line(cost: Mapping[str, int | None]) -> str:
    """A run's cost (`Job.cost`) on one line."""
    user, system = (cost["cpu_user_ms"] or 0) / 1000, (cost["cpu_system_ms"] or 0) / 1000
    latency = cost["start_latency_ms"]
    return (f"cpu {user + system:.3f}s (user {user:.3f}s, system {system:.3f}s)    "
            f"peak memory {format_size(cost['peak_memory'] or 0)}    "
            f"wall {(cost['wall_ms'] or 0) / 1000:.3f}s"
            + (f"    start latency {latency} ms" if latency is not None else ""))


def cost_rows(job: Job) -> list[str]:
    """`forq job`'s "cost" row of `job` (none when no run of it has finished)."""
    return [] if job.cost is None else [f"  {'cost':<10}{cost_line(job.cost)}"]
