"""The handlers forq's benchmarks enqueue (preloaded by the benchmark supervisors).

Each peer (RQ, Celery, Dramatiq) gets the same three in bench/peers/: a no-op, a
stamp that returns the wall-clock time at which the handler started, and a long job
that appends a start marker to a file (to see a job run again after a kill).
"""

from __future__ import annotations

import os
import time

from forq import task


@task("bench.noop")
def noop(*_args, **_kwargs) -> None:
    return None


@task("bench.stamp")
def stamp() -> float:
    """The wall clock when the handler started: enqueue→start latency, in µs."""
    return time.time()


@task("bench.marked_sleep")
def marked_sleep(path: str, seconds: float = 20.0) -> int:
    """Append "<pid> <time>" to `path` at start, then sleep: a job to kill."""
    with open(path, "a") as f:
        f.write(f"{os.getpid()} {time.time():.6f}\n")
    time.sleep(seconds)
    return os.getpid()


@task("bench.stamp_env")
def stamp_env() -> dict:
    """`stamp`, plus any BENCH_* marks a patched supervisor put in the child's
    environment (used to split pick-up latency when profiling)."""
    now = time.time()
    return {"t": now, **{k: v for k, v in os.environ.items() if k.startswith("BENCH_")}}


@task("bench.sleep_stamp")
def sleep_stamp(seconds: float = 0.0) -> float:
    """`stamp`, then sleep: a job of a given length whose start can be read back."""
    now = time.time()
    if seconds > 0:
        time.sleep(seconds)
    return now


@task("bench.hold_memory")
def hold_memory(mib: int, seconds: float = 0.0) -> float:
    """Allocate `mib` MiB and touch every page (so it is resident, not just reserved),
    hold it `seconds`, free it: a job of a known memory size (bench.memory_budget)."""
    now = time.time()
    buf = bytearray(mib << 20)
    buf[::4096] = b"\x01" * len(range(0, len(buf), 4096))
    if seconds > 0:
        time.sleep(seconds)
    del buf
    return now


@task("bench.segv")
def segv(*_args, **_kwargs) -> None:
    """A bad deploy: every job of this task kills its process with SIGSEGV
    (bench.breaker)."""
    import signal

    os.kill(os.getpid(), signal.SIGSEGV)
