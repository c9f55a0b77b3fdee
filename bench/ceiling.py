"""The Redis ceiling: how many jobs/s one Redis shard carries when many supervisors share
it, forq beside BullMQ, RQ and Dramatiq, on one private Redis in one run.

    .venv/bin/python -m bench.ceiling [--n 20000] [--procs 8] [--slots 50] [--reps 3]

forq: `--procs` processes, each a simulated supervisor with `--slots` slots that does
what a real one does per round trip, without forking: one pipeline holding a claim for
its free slots, an extension of every lease it holds when ttl/3 has passed, and one ack
call for the jobs of the previous round (no-op jobs finish at once). BullMQ: `--procs` Node
workers of concurrency `--slots`. RQ: `--procs` SimpleWorkers (one job at a time each).
Dramatiq: `--procs` processes × 8 threads. Every job carries the same realistic payload
(a mail job's arguments, about 170 bytes of JSON) and is enqueued before the workers
start.

For each system, between its first finished job and the last: Redis commands per job
(INFO commandstats, those run inside scripts included), Redis CPU per job (INFO cpu,
used_cpu_user + used_cpu_sys deltas), and the **ceiling**: jobs per Redis CPU second,
the rate one shard carries when Redis has a core to itself. On a 2-core machine the
clients compete with Redis for the cores, so the measured rate is well below the
ceiling; the Redis-side figures do not depend on that. Rounds interleave the systems,
so a change in the machine's load hits each alike.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    CEILING_KWARGS,
    RedisServer,
    ceiling_args,
    log,
    median,
    redis_cost,
    summary,
)
from forq.supervisor.leases.calls import LeaseCalls, leasing  # noqa: E402

QUEUE = "ceiling"
LEASE_MS = 30_000
PEERS = ("bullmq", "rq-simple", "dramatiq")
DRAMATIQ_THREADS = 8


def _policy() -> str:
    """The policy JSON a supervisor with the built-in defaults passes to claim."""
    from forq.supervisor.config.load import BUILTIN_POLICY

    return json.dumps({"defaults": dict(BUILTIN_POLICY), "tasks": {}})


def simulated_supervisor(url: str, slots: int, start_at: float, out: Any) -> None:
    """One supervisor's Redis traffic for no-op jobs, until the queue is empty."""
    from forq import Queue
    from forq.store.connection import connect

    client = connect(url)
    q = Queue(QUEUE, redis=client)
    owner = f"ceiling-{os.getpid()}"
    policy = _policy()
    held: dict[str, str] = {}  # job id -> token: leased, its (no-op) job done, not acked
    extended = time.monotonic()
    done = 0
    while time.time() < start_at:
        time.sleep(0.001)
    while True:
        pipe = client.pipeline(transaction=False)
        leasing(q).claim(owner, slots, LEASE_MS, policy, client=pipe)
        if held and time.monotonic() - extended >= LEASE_MS / 3000:
            leasing(q).extend(list(held.items()), LEASE_MS, client=pipe)
            extended = time.monotonic()
        if held:  # as the supervisor's Reporter does: one ack call for the turn's jobs
            leasing(q).ack_many([(job_id, token, "null", ()) for job_id, token in held.items()],
                       client=pipe)
        replies = pipe.execute()
        if held:
            acks = LeaseCalls.parse_acks(replies[-1])
            assert acks == ["ok"] * len(held), acks
        done += len(held)
        result = leasing(q).parse_claim(replies[0])
        held = {lease.id: lease.token for lease in result.leases}
        if not held and result.pending_left == 0:
            break
    out.put(done)


class ForqCeiling:
    """forq's side: `procs` simulated supervisors of `slots` slots each."""

    def __init__(self, url: str) -> None:
        from forq import Queue
        from forq.store.connection import connect

        self.url = url
        self.client = connect(url)
        self.q = Queue(QUEUE, redis=self.client)

    def done(self) -> int:
        return int(self.client.hget(self.q.keys.stats, "succeeded") or 0)

    def run(self, n: int, procs: int, slots: int) -> dict[str, Any]:
        self.client.flushdb()
        # warm: scripts loaded, then a clean slate
        self.q.enqueue("bench.noop")
        simulated_supervisor(self.url, 1, 0, mp.get_context("fork").SimpleQueue())
        self.client.flushdb()
        for start in range(0, n, 1000):
            self.q.enqueue_many([{"task": "bench.noop", "args": ceiling_args(i),
                                  "kwargs": CEILING_KWARGS}
                                 for i in range(start, min(n, start + 1000))])
        ctx = mp.get_context("fork")
        out = ctx.SimpleQueue()
        start_at = time.time() + 0.2
        workers = [ctx.Process(target=simulated_supervisor, args=(self.url, slots, start_at, out))
                   for _ in range(procs)]
        for w in workers:
            w.start()
        try:
            res = redis_cost(self.client, self.done, n, "hget", max(120, n / 20))
        finally:
            for w in workers:
                w.join(timeout=60)
                if w.is_alive():
                    w.kill()
        self.client.flushdb()
        return dict(res, n=n, procs=procs, concurrency=slots)


def peer_ceiling(system: str, redis_base: str, n: int, procs: int, slots: int) -> dict:
    from bench.__main__ import run_driver

    concurrency = {"bullmq": slots, "rq-simple": 1, "dramatiq": DRAMATIQ_THREADS}[system]
    return run_driver("ceiling", system, redis_base, 1, n=n, procs=procs,
                      concurrency=concurrency)


KEYS = ("jobs_per_s", "redis_cpu_us_per_job", "redis_ceiling_jobs_per_s", "redis_busy")


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one system → medians (with min/max/runs) of each figure."""
    out = {k: summary([r[k] for r in runs if r.get(k) is not None]) for k in KEYS}
    out["commands_per_job"] = summary([r["commands_per_job"]["total"] for r in runs])
    out["commands_top"] = runs[-1]["commands_per_job"]["top"]
    for k in ("n", "procs", "concurrency"):
        out[k] = runs[-1][k]
    return out


def measure(url: str, redis_base: str, n: int, procs: int, slots: int, reps: int,
            systems: tuple[str, ...] = ("forq", *PEERS)) -> dict[str, Any]:
    from bench.peers import venv

    if "bullmq" in systems and not venv.ensure_node(log):
        systems = tuple(s for s in systems if s != "bullmq")
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    forq = ForqCeiling(url)
    for i in range(reps):
        for system in systems:
            log(f"ceiling: round {i + 1}/{reps}: {system}, {n} jobs, {procs} processes ...")
            jobs = max(1, n // 5) if system == "rq-simple" else n  # RQ is slow
            if system == "forq":
                runs[system].append(forq.run(jobs, procs, slots))
            else:
                runs[system].append(peer_ceiling(system, redis_base, jobs, procs, slots))
    out: dict[str, Any] = {s: merge(r) for s, r in runs.items() if r}
    if "bullmq" in out:
        out["bullmq_version"] = venv.bullmq_version()
    base = out.get("bullmq", {}).get("redis_ceiling_jobs_per_s", {}).get("median")
    if base and "forq" in out:
        out["forq_vs_bullmq"] = out["forq"]["redis_ceiling_jobs_per_s"]["median"] / base
    return out


def render(res: dict[str, Any]) -> str:
    rows = ["| system | workers | commands/job | Redis CPU µs/job | ceiling, jobs/s (1 Redis core) "
            "| measured jobs/s (Redis busy) |", "| --- | --- | --- | --- | --- | --- |"]
    for system, r in res.items():
        if not isinstance(r, dict) or "procs" not in r:
            continue
        workers = f"{r['procs']} × {r['concurrency']}"
        us, ceil, rate = (r["redis_cpu_us_per_job"], r["redis_ceiling_jobs_per_s"],
                          r["jobs_per_s"])
        rows.append(
            f"| {system} | {workers} | {r['commands_per_job']['median']:.1f} | "
            f"{us['median']:.1f} ({us['min']:.1f}–{us['max']:.1f}) | "
            f"{ceil['median']:,.0f} ({ceil['min']:,.0f}–{ceil['max']:,.0f}) | "
            f"{rate['median']:,.0f} ({r['redis_busy']['median']:.0%}) |")
    if "forq_vs_bullmq" in res:
        rows.append(f"\nforq's ceiling / BullMQ's: **{res['forq_vs_bullmq']:.2f}×**")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ceiling",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000, help="jobs per system and round")
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--slots", type=int, default=50)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--only", help=f"comma-separated systems of forq,{','.join(PEERS)}")
    args = p.parse_args(argv)
    systems = tuple(args.only.split(",")) if args.only else ("forq", *PEERS)
    if any(s != "forq" for s in systems):
        from bench.peers import venv

        venv.ensure(log)
    with RedisServer() as server:
        res = measure(server.url(0), f"redis://127.0.0.1:{server.port}", args.n, args.procs,
                      args.slots, args.reps, systems)
    print(json.dumps(res, indent=2, default=str), file=sys.stderr)
    print(render(res))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"median of {args.reps} interleaved rounds (min–max)")
    return 0


__all__ = ["measure", "render", "median"]

if __name__ == "__main__":
    sys.exit(main())
