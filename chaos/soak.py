"""A soak: does anything grow without bound while forq works for hours?

``python -m chaos --soak`` runs the ordinary chaos harness (its supervisors, producer,
fault injector and checker) and, beside it, a `Sampler` that records at a fixed
interval (a minute by default) Redis's ``used_memory`` and key count, and each
supervisor's and each fork server's RSS and open fds. After the run, `judge` fits a
least-squares slope to every series past a warm-up (`chaos.trend`) and calls it a leak
only when the slope's whole confidence interval lies above the series' tolerance.

A restarted process starts with a fresh RSS, which would hide a leak (or fake a
drop). So a soak injects by default only the faults that replace none of the processes
it measures (`SOAK_FAULTS`: no supervisor kill or drain), and each series belongs to
one process (pid and start time): a process that does get replaced (a fork server that
died, a fault asked for with ``--faults``) starts a series of its own, with its own
warm-up.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis

from forq.store.keys import QueueKeys

from .context import OTHER_QUEUE, QUEUE, Context
from .procs import children_of
from .producer import client
from .report import LABEL, amount
from .trend import Fit, fit, verdict

# Retention (docs/operations/retention.md): every chaos supervisor of a soak keeps ended
# records for a short window (these TOML lines join its [defaults]), so Redis's memory
# and key count are bounded by it, not by the jobs told: the warm-up covers two windows
# and Redis's series are judged like the processes'. The monitor copies each ended
# record before the reaper trims it (chaos/monitor.py), so the checker still reads it.
# An empty RETENTION_DEFAULTS turns this off: Redis's growth per job is then reported,
# not judged. The key count is reported, not judged, either way: a batch's record lives a
# day whatever the keep (lua/includes/batches.lua), so a short run sees keys grow by
# about one per batch member. idempotency_ttl (the completion records of idempotent jobs)
# gets a short window too, longer than any reclaim a fault causes; result_ttl stays (a
# cancelled record expires by it, and the checker reads it at the end).
RETENTION_DEFAULTS = ('keep_succeeded = { age = "30s", count = 20000 }\n'
                      'keep_dead = { age = "30s", count = 20000 }\n'
                      'idempotency_ttl = "2m"')
RETENTION_WINDOW_S = 30.0

# what a soak injects unless --faults says otherwise: nothing that replaces a measured
# process (sup_kill and sup_term restart a supervisor, and its fork server with it)
SOAK_FAULTS = ("child_kill", "sup_stop", "redis_kill", "redis_stop", "memhog", "redis_full",
               "partition")

MIB = 1 << 20
# (growth per hour, growth over the judged window) that is not a leak, however certain:
# a day at the rate stays small, and a short run's allocator steps are not a trend
TOLERANCE = {
    "rss": (4 * MIB, 2 * MIB),
    # an fd is never kept slowly on purpose; but each child in flight holds about five
    # in its supervisor, so the low-water mark moves by a few with the load
    "fds": (1.0, 10.0),
    "used_memory": (4 * MIB, 2 * MIB),
    "keys": (100.0, 100.0),
}
FORK_SERVER_TITLE = "forq: fork server"
PAGE = os.sysconf("SC_PAGE_SIZE")


def redis_bounded() -> bool:
    return bool(RETENTION_DEFAULTS)


def default_warmup(duration: float, interval: float) -> float:
    """Skip the first window: the allocators and caches settle, every kind of job and
    fault has passed once, and retained records reach their steady count."""
    return max(3 * interval, duration / 4, 2 * RETENTION_WINDOW_S)


def process_usage(pid: int) -> dict[str, int] | None:
    """A process's identity (pid, start time in clock ticks), RSS in bytes and open fds."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/statm", "rb") as f:
            rss = int(f.read().split()[1]) * PAGE
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        start = int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return {"pid": pid, "start": start, "rss": rss, "fds": fds}


class Sampler(threading.Thread):
    """Until production ends (the load's steady part only: once it stops, memory falls,
    which would hide growth), one sample every `interval` s of everything measured.

    A sample holds each value's low-water mark over its interval, read every second:
    fds and RSS rise and fall with the children in flight and the jobs' own work, while
    a leak raises the level they fall back to, so the minimum shows a leak with far less
    noise than one reading would."""

    def __init__(self, ctx: Context, interval: float, read_every: float = 1.0) -> None:
        super().__init__(name="sampler", daemon=True)
        self.ctx = ctx
        self.interval = interval
        self.read_every = min(read_every, interval)
        self.samples: list[dict[str, Any]] = []

    def run(self) -> None:
        ctx = self.ctx
        r = client(ctx.redis.url, timeout=1.0)
        next_at = time.monotonic() + self.interval
        procs: dict[str, dict[str, int]] = {}
        stats: dict[str, int] | None = None
        try:
            while not (ctx.stop.is_set() or ctx.production_done.is_set()):
                self.read_processes(procs)
                stats = self.read_redis(r, stats)
                if time.monotonic() >= next_at:
                    self.samples.append({"t": time.time(), "told": len(ctx.told),
                                         "redis": stats, "procs": procs})
                    procs, stats = {}, None
                    next_at += self.interval
                ctx.stop.wait(max(0.0, min(self.read_every, next_at - time.monotonic())))
        except Exception as exc:  # noqa: BLE001 — a harness error, reported as such
            ctx.errors.append(f"soak sampler: {type(exc).__name__}: {exc}")

    def read_processes(self, low: dict[str, dict[str, int]]) -> None:
        """Each supervisor's and fork server's usage, into its low-water mark in `low`
        (a new process, another pid or start time, replaces the old one's)."""
        for sp in self.ctx.supervisors:
            pid = sp.pid
            if pid is None or sp.state not in ("running", "stopped"):
                continue
            found = [(f"{sp.name} supervisor", process_usage(pid))]
            found += [(f"{sp.name} fork server", process_usage(kid))
                      for kid, title, _ in children_of(pid)
                      if title.startswith(FORK_SERVER_TITLE) and "spare" not in title]
            for name, usage in found:
                if usage is None:
                    continue
                was = low.get(name)
                if was is None or (was["pid"], was["start"]) != (usage["pid"], usage["start"]):
                    low[name] = usage
                else:
                    was["rss"] = min(was["rss"], usage["rss"])
                    was["fds"] = min(was["fds"], usage["fds"])

    @staticmethod
    def read_redis(r: redis.Redis, low: dict[str, int] | None) -> dict[str, int] | None:
        """Redis's `used_memory` less the event streams, and its key count. chaos keeps
        every event (`events_keep`, for its checker: invariant 13), so those streams grow
        with the jobs told, by design of the harness, not of forq (a 20-minute soak: 26.4
        of Redis's 28.0 MiB at its end); forq's default keep bounds them."""
        try:
            pipe = r.pipeline(transaction=False)
            pipe.info("memory")
            pipe.dbsize()
            for queue in (QUEUE, OTHER_QUEUE):
                pipe.memory_usage(QueueKeys(queue).events, samples=0)
            info, keys, *streams = pipe.execute()
            now = {"used_memory": int(info["used_memory"]) - sum(int(b or 0) for b in streams),
                   "keys": int(keys)}
        except (redis.RedisError, OSError):
            return low  # Redis down or paused by a fault: this reading has nothing
        if low is None:
            return now
        return {k: min(v, now[k]) for k, v in low.items()}


def _series(name: str, metric: str, points: list[tuple[float, float]], t0: float,
            judged: bool, pid: int | None = None) -> dict[str, Any]:
    f = fit([t - t0 for t, _ in points], [y for _, y in points])
    per_h = 3600.0
    out: dict[str, Any] = {"name": name, "metric": metric, "pid": pid, "n": len(points),
                           "first": points[0][1] if points else None,
                           "last": points[-1][1] if points else None,
                           "fit": f.as_dict() if f else None, "judged": judged}
    if f is not None:
        out.update(per_min=f.slope * 60, per_hour=f.slope * per_h, low_per_hour=f.low * per_h,
                   high_per_hour=f.high * per_h)
    per_hour, floor = TOLERANCE[metric]
    out["tolerance"] = {"per_hour": per_hour, "over_window": floor}
    out["verdict"] = verdict(f, per_hour / per_h, floor) if judged else "not judged"
    return out


def _lifetimes(samples: list[dict[str, Any]]) -> dict[str, list[list[dict[str, Any]]]]:
    """Per measured process name, its samples split by process (pid, start time)."""
    out: dict[str, list[list[dict[str, Any]]]] = {}
    for s in samples:
        for name, usage in s["procs"].items():
            runs = out.setdefault(name, [])
            ident = (usage["pid"], usage["start"])
            if not runs or (runs[-1][-1]["pid"], runs[-1][-1]["start"]) != ident:
                runs.append([])
            runs[-1].append({"t": s["t"], **usage})
    return out


def judge(samples: list[dict[str, Any]], *, interval: float, warmup: float,
          expected: Iterable[str]) -> dict[str, Any]:
    """Every series' slope and verdict, past the warm-up of its own process; Redis's
    series judged only when retention bounds them (`RETENTION_DEFAULTS`), its growth
    per told job given either way. `expected`: the process names that must have been
    measured (a soak that measured nothing must not pass)."""
    series: list[dict[str, Any]] = []
    problems: list[str] = []
    t0 = samples[0]["t"] if samples else 0.0
    lifetimes = _lifetimes(samples)
    for name in expected:
        runs = lifetimes.get(name, [])
        judged_any = False
        for run in runs:
            kept = [p for p in run if p["t"] >= run[0]["t"] + warmup]
            for metric in ("rss", "fds"):
                row = _series(name, metric, [(p["t"], p[metric]) for p in kept], t0, True,
                              pid=run[0]["pid"])
                row["lifetimes"] = len(runs)
                series.append(row)
                judged_any |= row["fit"] is not None
        if not judged_any:
            longest = max((len(run) for run in runs), default=0)
            problems.append(f"{name}: too few samples after the {warmup:g}s warm-up "
                            f"(longest process {longest} samples, every {interval:g}s)")
    redis_points = [s for s in samples if s["redis"] is not None and s["t"] >= t0 + warmup]
    bounded = redis_bounded()
    per_job: dict[str, float | None] = {}
    for metric in ("used_memory", "keys"):
        points = [(s["t"], s["redis"][metric]) for s in redis_points]
        series.append(_series("redis", metric, points, t0, bounded and metric == "used_memory"))
        by_job: Fit | None = fit([s["told"] for s in redis_points],
                                 [s["redis"][metric] for s in redis_points])
        per_job[metric] = by_job.slope if by_job else None
    leaking = [row for row in series if row["verdict"] == "leak"]
    problems += [f"{row['name']} {LABEL.get(row['metric'], row['metric'])} grows "
                 f"{amount(row['metric'], row['per_min'], sign=True)} a minute" for row in leaking]
    return {"interval": interval, "warmup": warmup, "redis_bounded": bounded,
            "tolerance": TOLERANCE,
            "retention": RETENTION_DEFAULTS or None, "series": series,
            "redis_per_job": per_job, "problems": problems,
            "leaks": [f"{row['name']} {row['metric']}" for row in leaking],
            "ok": not problems, "samples": samples}
