"""Handlers of bench/steps.py (preloaded by its supervisor beside bench.tasks)."""

from __future__ import annotations

from forq import current, task


@task("bench.progress")
def progress(calls: int) -> int:
    """Report progress `calls` times in a row (the child throttles it)."""
    for i in range(calls):
        current().progress(i / calls)
    return calls


@task("bench.steps")
def steps(n: int) -> int:
    """`n` durable steps of a no-op function, one after another (each waits for Redis)."""
    for i in range(n):
        current().step(f"s{i}", int, i)
    return n
