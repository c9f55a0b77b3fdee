"""What `prefetch` buys and what it costs: the default, decided by measurement.

    .venv/bin/python -m bench.prefetch [--rounds 2] [--seconds 10] [--values 0,auto,4]

* throughput: no-op jobs drained by one supervisor (concurrency 2) with each prefetch
  value, alternating in rounds (`bench.supervisor.drain_once`);
* a fleet's latency: two supervisors of concurrency 2 on one queue, fed at about 60%
  of their capacity with a mix of one 300 ms job in five and no-ops between them
  (Poisson arrivals), for `--seconds` per value: how long a job waits from its enqueue
  to its handler's start, at p50 and p99, for all jobs and for the no-ops alone. A
  supervisor that holds jobs ahead of a busy slot makes them wait behind its running
  job while its peer may be idle: the cost prefetch puts on a fleet.

Prints one JSON object (and a table on stderr).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from typing import Any

from bench.common import (
    ForqSupervisor,
    RedisServer,
    log,
    percentile,
    remove_queue,
    summary,
    wait_until,
    workdir,
    write_forq_config,
)
from bench.supervisor import drain_once
from forq import Queue
from forq.store.connection import connect

LONG_S = 0.3  # one job in LONG_EVERY sleeps this long
LONG_EVERY = 5
LOAD = 0.6  # of the fleet's capacity


def _setting(prefetch: str) -> str:
    """The [[queue]] line: a number, or "auto" (quoted in TOML)."""
    return f'prefetch = "{prefetch}"\n' if prefetch == "auto" else f"prefetch = {prefetch}\n"


def fleet_latency(url: str, prefetch: str, seconds: float, supervisors: int = 2,
                  concurrency: int = 2) -> dict[str, Any]:
    r = connect(url)
    name = f"bench-fleet-{uuid.uuid4().hex[:8]}"
    q = Queue(name, redis=r)
    wd = workdir()
    cfg = write_forq_config(wd / f"{name}.toml", url, name, concurrency,
                            queue_extra=_setting(prefetch))
    sups = [ForqSupervisor(cfg, wd / f"{name}-{i}.log").start() for i in range(supervisors)]
    mean_job = LONG_S / LONG_EVERY
    rate = LOAD * supervisors * concurrency / mean_job
    rng = random.Random(seconds)
    jobs: list[tuple[Any, float, bool]] = []
    try:
        time.sleep(0.5)
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            long = i % LONG_EVERY == 0
            t0 = time.time()
            job = q.enqueue("bench.sleep_stamp", LONG_S if long else 0.0)
            jobs.append((job, t0, long))
            i += 1
            time.sleep(rng.expovariate(rate))
        keys = [q.keys.job(j.id) for j, _, _ in jobs]

        def finished() -> list[Any] | None:
            pipe = r.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(key, "state", "result")
            rows = pipe.execute()
            return rows if all(row[0] == "succeeded" for row in rows) else None

        rows = wait_until(finished, 60, 0.05, "the fleet's jobs")
    finally:
        for sup in sups:
            sup.stop()
        remove_queue(r, name)
    waits = [(float(row[1]) - t0) * 1000 for row, (_, t0, _) in zip(rows, jobs, strict=True)]
    short = [w for w, (_, _, long) in zip(waits, jobs, strict=True) if not long]
    return {"prefetch": prefetch, "jobs": len(jobs), "rate": rate,
            "p50_ms": percentile(waits, 50), "p99_ms": percentile(waits, 99),
            "short_p50_ms": percentile(short, 50), "short_p99_ms": percentile(short, 99),
            "max_ms": max(waits)}


def measure(url: str, values: list[str], rounds: int, seconds: float,
            drain_n: int = 1000) -> dict[str, Any]:
    drains: dict[str, list[float]] = {v: [] for v in values}
    fleets: dict[str, list[dict[str, Any]]] = {v: [] for v in values}
    for i in range(rounds):
        for v in values:
            log(f"prefetch: round {i + 1}/{rounds}, prefetch {v}: drain, fleet ...")
            drains[v].append(drain_once(url, drain_n, queue_extra=_setting(v))["jobs_per_s"])
            fleets[v].append(fleet_latency(url, v, seconds))
    out: dict[str, Any] = {"values": values, "long_s": LONG_S, "long_every": LONG_EVERY,
                           "load": LOAD, "throughput": {}, "fleet": {}}
    for v in values:
        out["throughput"][v] = summary(drains[v])
        runs = fleets[v]
        out["fleet"][v] = {k: percentile([run[k] for run in runs], 50)
                           for k in ("p50_ms", "p99_ms", "short_p50_ms", "short_p99_ms",
                                     "max_ms")}
        out["fleet"][v]["runs"] = runs
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--values", default="0,auto,4", help="prefetch values: numbers or auto")
    args = p.parse_args(argv)
    values = args.values.split(",")
    with RedisServer() as server:
        res = measure(server.url(0), values, args.rounds, args.seconds)
    base = res["throughput"][values[0]]["median"]
    print(f"{'prefetch':>8} {'jobs/s':>8} {'ratio':>6} {'wait p50':>9} {'p99':>8} "
          f"{'no-op p50':>10} {'p99':>8}", file=sys.stderr)
    for v in values:
        t, f = res["throughput"][v], res["fleet"][v]
        print(f"{v:>8} {t['median']:8.0f} {t['median'] / base:6.2f} {f['p50_ms']:9.1f} "
              f"{f['p99_ms']:8.1f} {f['short_p50_ms']:10.1f} {f['short_p99_ms']:8.1f}",
              file=sys.stderr)
    json.dump(res, sys.stdout, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
