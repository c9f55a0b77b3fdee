"""A supervisor holding many leases: 1,000 sleeping jobs at concurrency 1,000.

    .venv/bin/python -m bench.leases [--jobs 1000] [--lease-ttl 6s] [--window 12]

Starts a real supervisor (fork server on, the default `memory_sample_interval`, RSS
sampling as on a host without per-job cgroups), enqueues `--jobs` jobs that sleep
longer than the run, waits until every one is running, then over `--window` seconds
measures:

* the supervisor's CPU (utime + stime from /proc) as a share of one core — the cost of
  keeping 1,000 leases (one batched extension every ttl/3), watching 1,000 children and
  sampling their memory;
* the lease slack: at each look, the earliest lease deadline in the queue's `active`
  set minus Redis time. Extensions on schedule keep it above 2/3 of the ttl; below
  1/3 means an extension came later than its ttl/3 budget;
* the supervisor's RSS (and the fork server's) with every child running;
* how many leases ran out and were reclaimed meanwhile (0 when extension kept up, also
  while the 1,000 children were being started).

Then SIGTERM twice stops it: the children are stopped and their leases released.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    ForqSupervisor,
    RedisServer,
    descendants,
    log,
    rss_bytes,
    wait_until,
    workdir,
    write_forq_config,
)

QUEUE = "leases"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def redis_ms(r: Any) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def measure(url: str, jobs: int, lease_ttl: float, window: float) -> dict[str, Any]:
    from forq import Queue
    from forq.store.connection import connect

    r = connect(url)
    r.flushdb()
    q = Queue(QUEUE, redis=r)
    cfg = write_forq_config(workdir() / "leases.toml", url, QUEUE, concurrency=jobs,
                            lease_ttl=f"{lease_ttl}s", timeout="10m")
    sup = ForqSupervisor(cfg).start()
    try:
        started = time.monotonic()
        q.enqueue_many([{"task": "bench.marked_sleep",
                         "args": [str(workdir() / "leases.marks"), 600]}
                        for _ in range(jobs)])
        wait_until(lambda: r.zcard(q.keys.active) >= jobs and len(descendants(sup.pid)) > jobs,
                   max(120, jobs / 3), 0.1, f"{jobs} jobs running")
        ramp = time.monotonic() - started
        time.sleep(lease_ttl / 3)  # past the start-up burst: one extension round at least
        cpu0, t0 = cpu_seconds(sup.pid), time.monotonic()
        slack = []
        while time.monotonic() - t0 < window:
            first = r.zrange(q.keys.active, 0, 0, withscores=True)
            if first:
                slack.append((first[0][1] - redis_ms(r)) / (lease_ttl * 1000))
            time.sleep(0.05)
        cpu = (cpu_seconds(sup.pid) - cpu0) / (time.monotonic() - t0)
        kids = descendants(sup.pid)
        server = [p for p in kids if _comm(p).startswith("forq: fork serv")]
        running = r.zcard(q.keys.active)
        reclaimed = int(r.hget(q.keys.stats, "crashed") or 0)  # leases that ran out
        return {"jobs": jobs, "running": running, "reclaimed": reclaimed,
                "lease_ttl_s": lease_ttl,
                "window_s": window, "ramp_s": ramp,
                "supervisor_cpu_share": cpu,
                "lease_slack_min": min(slack) if slack else None,
                "lease_slack_samples": len(slack),
                "supervisor_rss": sup.rss(),
                "fork_server_rss": rss_bytes(server[0]) if server else None,
                "memory_sample_interval_s": 0.05}
    finally:
        sup.stop(timeout=60)
        r.flushdb()


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.leases", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--lease-ttl", type=float, default=6.0)
    p.add_argument("--window", type=float, default=12.0)
    args = p.parse_args(argv)
    with RedisServer() as server:
        res = measure(server.url(0), args.jobs, args.lease_ttl, args.window)
    print(json.dumps(res, indent=2))
    log(f"{res['running']} leases held; supervisor {res['supervisor_cpu_share']:.1%} of a core, "
        f"RSS {res['supervisor_rss'] / 2**20:.1f} MiB; earliest lease never below "
        f"{res['lease_slack_min']:.0%} of the ttl left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
