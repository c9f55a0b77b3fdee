"""forq at big backlogs: claim+ack rate at 1k, 100k and 1M pending jobs (a claim must
cost O(log n)), Redis bytes per queued job, and a supervisor draining from the top of
the big backlog (its rate and RSS must not depend on the backlog either).

claim+ack is measured two ways, both through the public lease API (`Queue.claim`,
`Queue.ack`): one job per claim with its ack (as a supervisor with one free slot does),
and 100 per claim with the acks pipelined (as bench/core.py does).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import ForqSupervisor, log, median, wait_until, write_forq_config
from bench.supervisor import _cpu_seconds, _tmpdir, remove_queue
from forq import Queue
from forq.store.connection import connect
from forq.supervisor.leases.calls import leasing

OWNER = "bench-scale:1"
LEASE_MS = 300_000
CHUNK = 50_000


def job_spec(i: int) -> dict[str, Any]:
    return {"task": "bench.noop", "args": [i, "a short payload, like an email address"]}


def fill(q: Queue, n: int) -> float:
    """Enqueue n jobs with enqueue_many; returns jobs/s."""
    t0 = time.perf_counter()
    for start in range(0, n, CHUNK):
        q.enqueue_many([job_spec(start + i) for i in range(min(CHUNK, n - start))])
    return n / (time.perf_counter() - t0)


def claim_ack(q: Queue, n: int, batch: int) -> float:
    t0 = time.perf_counter()
    done = 0
    while done < n:
        res = leasing(q).claim(OWNER, min(batch, n - done), LEASE_MS)
        if not res.leases:
            raise RuntimeError("backlog ran out")
        if len(res.leases) == 1:
            lease = res.leases[0]
            assert leasing(q).ack(lease.id, lease.token, "null") == "ok"
        else:
            pipe = q.redis.pipeline(transaction=False)
            for lease in res.leases:
                leasing(q).ack(lease.id, lease.token, "null", client=pipe)
            pipe.execute()
        done += len(res.leases)
    return n / (time.perf_counter() - t0)


def supervisor_drain(url: str, q: Queue, jobs: int, workdir: Path) -> dict[str, Any]:
    """A supervisor (concurrency 2) draining `jobs` off the top of q's backlog."""
    r = q.redis
    cfg = write_forq_config(workdir / f"{q.name}.toml", url, q.name, 2)
    base = int(r.hget(q.keys.stats, "succeeded") or 0)
    with ForqSupervisor(cfg, workdir / f"{q.name}.log") as sup:
        first = wait_until(lambda: int(r.hget(q.keys.stats, "succeeded") or 0) > base and True,
                           60, 0.002, "first job")
        assert first
        c1 = int(r.hget(q.keys.stats, "succeeded") or 0)
        t1 = time.perf_counter()
        cpu1 = _cpu_seconds(sup.pid)[0]
        c2 = wait_until(lambda: (c := int(r.hget(q.keys.stats, "succeeded") or 0)) >= c1 + jobs
                        and c, 120, 0.01, "jobs done")
        t2 = time.perf_counter()
        cpu2 = _cpu_seconds(sup.pid)[0]
        rss = sup.rss()
    return {"jobs_per_s": (c2 - c1) / (t2 - t1), "supervisor_rss": rss,
            "parent_cpu_ms_per_job": (cpu2 - cpu1) / (c2 - c1) * 1000}


def measure(url: str, backlogs: list[int], reps: int = 3, sup_jobs: int = 2000,
            k_single: int = 3000, k_batch: int = 10_000, private: bool = False) -> dict[str, Any]:
    """Build every backlog first, then measure them round-robin, so a change in the
    machine's load during the section hits every backlog alike."""
    r = connect(url)
    workdir = _tmpdir()
    out: dict[str, Any] = {}
    queues: dict[int, Queue] = {}
    try:
        for backlog in backlogs:
            q = queues[backlog] = Queue(f"bench-scale-{backlog}-{uuid.uuid4().hex[:6]}", redis=r)
            log(f"scale: filling a backlog of {backlog:,} ...")
            r.execute_command("MEMORY", "PURGE")
            mem0 = r.info("memory")["used_memory"]
            fill_rate = fill(q, backlog)
            mem1 = r.info("memory")["used_memory"]
            out[str(backlog)] = {"backlog": backlog, "fill_jobs_per_s": fill_rate,
                                 "redis_bytes_per_job": (mem1 - mem0) / backlog,
                                 "claim_ack_1_runs": [], "claim_ack_100_runs": []}
        log(f"scale: claim+ack at {', '.join(f'{b:,}' for b in backlogs)}, x {reps} ...")
        for _ in range(reps):
            for backlog, q in queues.items():
                entry = out[str(backlog)]
                # refill what each measure took: the backlog stays where it was
                k = min(k_single, backlog)
                entry["claim_ack_1_runs"].append(claim_ack(q, k, 1))
                fill(q, k)
                k = min(k_batch, backlog)
                entry["claim_ack_100_runs"].append(claim_ack(q, k, 100))
                fill(q, k)
        for backlog in backlogs:
            entry = out[str(backlog)]
            entry["claim_ack_1"] = median(entry["claim_ack_1_runs"])
            entry["claim_ack_100"] = median(entry["claim_ack_100_runs"])
        if sup_jobs:
            for backlog, q in queues.items():
                jobs = min(sup_jobs, int(backlog * 0.8))
                log(f"scale: a supervisor drains {jobs:,} off a backlog of {backlog:,} ...")
                out[str(backlog)]["supervisor"] = supervisor_drain(url, q, jobs, workdir)
    finally:
        if private:
            r.flushdb()
        else:
            for q in queues.values():
                remove_queue(r, q.name)
    return out
