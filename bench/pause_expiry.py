"""Pause and expiry before start: what they add to the claim/ack path, side by side with
the path before them, in one run on one private Redis.

    .venv/bin/python -m bench.pause_expiry                      # 200,000 jobs a scenario
    .venv/bin/python -m bench.pause_expiry --jobs 50000 --measure 20000 --single 2000

Each scenario fills a fresh queue with `--jobs` no-op jobs (enqueue_many), then drains
`--measure` of them through the public lease API from one client, as bench/groups.py
does (*claim 100*: claims of 100, acks pipelined; *claim 1*: one claim and one ack a job).
Redis commands per job (INFO commandstats, the commands inside the scripts included)
are counted over the enqueue and over the claim-100 drain.

* ``plain, before``: enqueue, claim and ack as they were before pause landed (read from
  git), the baseline the plain path must not fall behind;
* ``plain``: this checkout's scripts (claim reads the paused flag in the HMGET of the
  limits it already did; a job without an expiry pays a Lua table lookup);
* ``expires_in="1h"``: every job with an expiry that does not pass: enqueue indexes it
  (one ZADD), its first claim takes it out of the index (one ZREM).

Then the reaper's side, per call: a sweep with nothing expired, a sweep of 100 expired
jobs, and a claim of a paused queue.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RedisServer,
    command_calls,
    commands_per_job,
    enqueue_noops,
    log,
    scripts_at,
)
from bench.groups import drain  # noqa: E402
from forq import Queue  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.supervisor.leases.calls import leasing

OWNER = "bench-pause:1"
BEFORE = "8cf5160~1"  # the commit before lua/pause.lua (and then expiry) landed


def before_scripts(client: Any) -> dict[str, Any] | None:
    """enqueue, claim and ack as they were at BEFORE (None without git history)."""
    return scripts_at(client, BEFORE)


def fill(q: Queue, n: int, expires_in: str | None) -> float:
    """n jobs by enqueue_many; returns jobs/s."""
    return enqueue_noops(q, n, (lambda _i: {"expires_in": expires_in}) if expires_in else None)


def scenario(url: str, name: str, jobs: int, measure: int, single: int,
             expires_in: str | None = None, before: bool = False) -> dict[str, Any]:
    client = connect(url)
    client.flushdb()
    q = Queue("bp" + uuid.uuid4().hex[:8], redis=client)
    if before:
        old = before_scripts(client)
        if old is None:
            return {"name": name, "skipped": "no git history to read the old scripts from"}
        q.scripts._by_name.update(old)  # type: ignore[arg-type]
    log(f"pause_expiry: {name}: filling {jobs:,} jobs")
    calls0 = command_calls(client)
    enqueue_rate = fill(q, jobs, expires_in)
    enqueue_cmds = commands_per_job(calls0, command_calls(client), jobs)
    log(f"pause_expiry: {name}: claim 100 + acks, {measure:,} jobs")
    calls0 = command_calls(client)
    batch_rate = drain(q, measure, 100)
    per_job = commands_per_job(calls0, command_calls(client), measure)
    single_rate = drain(q, single, 1)
    client.flushdb()
    return {"name": name, "jobs": jobs, "enqueue_per_s": enqueue_rate,
            "enqueue_commands_per_job": enqueue_cmds["total"],
            "claim100_per_s": batch_rate, "claim1_per_s": single_rate,
            "commands_per_job": per_job["total"], "top": per_job["top"]}


def per_call(client: Any, call: Any, n: int) -> tuple[float, float]:
    """(Redis commands per call, µs per call) of `call()` run n times."""
    calls0 = command_calls(client)
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    elapsed = time.perf_counter() - t0
    return commands_per_job(calls0, command_calls(client), n)["total"], elapsed / n * 1e6


def reaper_side(url: str, calls: int) -> dict[str, Any]:
    client = connect(url)
    client.flushdb()
    q = Queue("bp" + uuid.uuid4().hex[:8], redis=client)
    q.enqueue_many([{"task": "bench.noop", "expires_in": "1h"} for _ in range(1000)])
    empty = per_call(client, lambda: leasing(q).sweep_expired(OWNER), calls)
    q.pause()
    paused = per_call(client, lambda: leasing(q).claim(OWNER, 32, 60_000), calls)
    q.resume()
    client.flushdb()
    n = 100 * 100
    q.enqueue_many([{"task": "bench.noop", "expires_in": "1ms"} for _ in range(n)])
    wait = time.monotonic() + 1
    while time.monotonic() < wait and client.zcount(q.keys.expiring, "-inf",
                                                    int(time.time() * 1000) - 50) < n:
        time.sleep(0.01)  # bench only: the 1 ms expiry passes
    swept = per_call(client, lambda: leasing(q).sweep_expired(OWNER, limit=100), n // 100)
    assert q.stats()["dead"] == n, q.stats()
    client.flushdb()
    return {"sweep, nothing expired": empty, "claim of a paused queue": paused,
            "sweep of 100 expired": swept}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200_000, help="backlog per scenario")
    parser.add_argument("--measure", type=int, default=50_000,
                        help="jobs drained by claims of 100")
    parser.add_argument("--single", type=int, default=3_000, help="jobs drained one a claim")
    parser.add_argument("--calls", type=int, default=2_000, help="reaper-side calls timed")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    with RedisServer() as server:
        url = server.url(0)
        common = (args.jobs, args.measure, args.single)
        rows = [scenario(url, "plain, before", *common, before=True),
                scenario(url, "plain", *common),
                scenario(url, 'expires_in="1h"', *common, expires_in="1h")]
        reaper = reaper_side(url, args.calls)
    base = next((r for r in rows if r["name"] == "plain, before" and "skipped" not in r), None)
    print(f"\n{args.jobs:,} jobs per scenario; claim 100 over {args.measure:,}, "
          f"claim 1 over {args.single:,}\n")
    print("| scenario | enqueue_many, jobs/s | commands/job (enqueue) | claim 100 + acks, "
          "jobs/s | ÷ before | claim 1 + ack, jobs/s | commands/job (claim 100 + ack) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['name']} | skipped: {r['skipped']} | | | | | |")
            continue
        ratio = f"{r['claim100_per_s'] / base['claim100_per_s']:.2f}" if base else "-"
        print(f"| {r['name']} | {r['enqueue_per_s']:,.0f} | "
              f"{r['enqueue_commands_per_job']:.2f} | {r['claim100_per_s']:,.0f} | {ratio} | "
              f"{r['claim1_per_s']:,.0f} | {r['commands_per_job']:.2f} |")
    print("\n| reaper / claim call | Redis commands per call | µs per call (client) |")
    print("| --- | --- | --- |")
    for what, (commands, micros) in reaper.items():
        print(f"| {what} | {commands:.2f} | {micros:.0f} |")
    print()
    for r in rows:
        if "top" in r:
            print(f"- {r['name']}: {json.dumps(r['top'])}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "reaper": reaper}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
