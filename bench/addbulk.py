"""forq's `enqueue_many` beside BullMQ's `addBulk`, in the enqueue round of `python -m bench`
(issue 27: enqueue_many ≥ 2.5× addBulk, measured in the same run).

Both get the same jobs: no-op jobs without arguments (BullMQ: data ``{}``), and jobs
carrying a mail job's arguments (≈ 170 bytes of JSON, `bench.common.ceiling_args`, the
payload of the Redis-ceiling section; BullMQ: the same object as its data). Each side
builds its job list first and times only the producer call: forq's `enqueue_many` of the
whole list (validation, encoding, 500 jobs a script call, one pipeline), BullMQ's
`addBulk` 1,000 jobs a call from the first call to the last's return, timed in Node
(`bench/peers/bullmq/ceiling.js addbulk`), after a warm-up call loaded its scripts.

    .venv/bin/python -m bench.addbulk [--n 20000] [--rounds 3] [--before CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import CEILING_KWARGS, REPO, RedisServer, ceiling_args, log, median, summary
from bench.peers import venv

PAYLOADS = ("noop", "mail")  # ceiling.js's names for the two kinds of job


def forq_items(n: int, payload: str) -> list[dict[str, Any]]:
    if payload == "mail":
        return [{"task": "bench.noop", "args": ceiling_args(i), "kwargs": CEILING_KWARGS}
                for i in range(n)]
    return [{"task": "bench.noop"} for _ in range(n)]


def redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def forq_many(url: str, n: int, payload: str) -> dict[str, float]:
    """forq `enqueue_many` of `n` jobs: jobs/s (the list built before the clock), and
    the CPU µs per job of this process and of Redis meanwhile."""
    from bench.supervisor import remove_queue
    from forq import Queue
    from forq.store.connection import connect

    r = connect(url)
    q = Queue(f"bench-many-{os.getpid()}-{time.monotonic_ns()}", redis=r)
    q.enqueue("bench.noop")  # warm: scripts loaded, queue registered
    items = forq_items(n, payload)
    r0, c0, t0 = redis_cpu(r), time.process_time(), time.perf_counter()
    q.enqueue_many(items)
    t1, c1, r1 = time.perf_counter(), time.process_time(), redis_cpu(r)
    remove_queue(r, q.name)
    return {"jobs_per_s": n / (t1 - t0), "client_cpu_us_per_job": (c1 - c0) / n * 1e6,
            "redis_cpu_us_per_job": (r1 - r0) / n * 1e6}


def bullmq_add_bulk(url: str, n: int, payload: str) -> dict[str, float]:
    """BullMQ `addBulk` of `n` jobs into a flushed database: jobs/s as Node timed it, and
    the CPU µs per job of Node and of Redis meanwhile."""
    import redis

    redis.Redis.from_url(url).flushdb()
    cmd = ["node", str(venv.BULLMQ / "ceiling.js"), "addbulk", url, "enqueue", str(n), payload]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(venv.BULLMQ),
                          timeout=300)
    redis.Redis.from_url(url).flushdb()
    if proc.returncode != 0:
        raise RuntimeError(f"BullMQ addBulk failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {k: float(out[k]) for k in ("jobs_per_s", "client_cpu_us_per_job",
                                       "redis_cpu_us_per_job")}


Round = dict[str, dict[str, dict[str, float]]]  # payload -> system -> measure -> value


def forq_many_in(checkout: Path, url: str, n: int, payload: str) -> dict[str, float]:
    """`forq_many` with the forq of another checkout (its .venv, e.g. main's before a
    change), this file's code: a before beside the after, in the same round."""
    code = ("import json, sys; from bench.addbulk import forq_many; "
            f"print(json.dumps(forq_many({url!r}, {n}, {payload!r})))")
    proc = subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-c", code],
                          capture_output=True, text=True, timeout=600, check=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=str(REPO))
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def one_round(url: str, bullmq_url: str | None, n: int, before: Path | None = None) -> Round:
    """forq then BullMQ for each payload: {payload: {"forq": {...}, "bullmq": {...}}};
    with `before` (a checkout), its forq first, as "before"."""
    out: Round = {}
    for payload in PAYLOADS:
        out[payload] = {"before": forq_many_in(before, url, n, payload)} if before else {}
        out[payload]["forq"] = forq_many(url, n, payload)
        if bullmq_url:
            out[payload]["bullmq"] = bullmq_add_bulk(bullmq_url, n, payload)
    return out


def _system(per: list[dict[str, float]], n: int) -> dict[str, Any]:
    """Rates over the rounds (summary: median, runs) and the median CPU per job."""
    return dict(summary([p["jobs_per_s"] for p in per]), n=n,
                client_cpu_us_per_job=median(p["client_cpu_us_per_job"] for p in per),
                redis_cpu_us_per_job=median(p["redis_cpu_us_per_job"] for p in per))


def summarize(rounds: list[Round], n: int) -> dict[str, Any]:
    """Per payload: both rates over the rounds, and forq ÷ BullMQ of each round (the
    ratio the target reads is the median of those, each taken within one round)."""
    out: dict[str, Any] = {"n": n}
    for payload in PAYLOADS:
        per = [r[payload] for r in rounds if payload in r]
        entry: dict[str, Any] = {"forq": _system([p["forq"] for p in per], n)}
        bull = [p for p in per if "bullmq" in p]
        if bull:
            entry["bullmq"] = _system([p["bullmq"] for p in bull], n)
            entry["ratio"] = summary([p["forq"]["jobs_per_s"] / p["bullmq"]["jobs_per_s"]
                                      for p in bull])
        old = [p for p in bull if "before" in p]
        if old:
            entry["before"] = _system([p["before"] for p in old], n)
            entry["before_ratio"] = summary([p["before"]["jobs_per_s"] / p["bullmq"]["jobs_per_s"]
                                             for p in old])
        out[payload] = entry
    return out


def ratio_line(result: dict[str, Any]) -> str:
    parts = []
    for payload in PAYLOADS:
        entry = result.get(payload) or {}
        if "ratio" in entry:
            f, b = entry["forq"], entry["bullmq"]
            parts.append(f"{payload}: forq {f['median']:,.0f}/s (CPU µs/job: client "
                         f"{f['client_cpu_us_per_job']:.1f}, Redis {f['redis_cpu_us_per_job']:.1f}),"
                         f" BullMQ {b['median']:,.0f}/s ({b['client_cpu_us_per_job']:.1f}, "
                         f"{b['redis_cpu_us_per_job']:.1f}), enqueue_many / addBulk "
                         f"{entry['ratio']['median']:.2f}×")
            if "before" in entry:
                e = entry["before"]
                parts[-1] += (f" (before: {e['median']:,.0f}/s ({e['client_cpu_us_per_job']:.1f}, "
                              f"{e['redis_cpu_us_per_job']:.1f}), "
                              f"{entry['before_ratio']['median']:.2f}×)")
    return "; ".join(parts) or "BullMQ not measured (no node/npm)"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.addbulk", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", type=Path, help="a checkout (with its .venv) whose forq each "
                   "round measures first, as the before of a change (e.g. /work/main)")
    args = p.parse_args()
    have_node = venv.ensure_node(log)
    with RedisServer() as server:
        rounds = []
        for i in range(args.rounds):
            rounds.append(one_round(server.url(0), server.url(4) if have_node else None, args.n,
                                    args.before))
            log(f"round {i + 1}: " + ratio_line(summarize(rounds[-1:], args.n)))
        result = summarize(rounds, args.n)
    print(json.dumps(result, indent=2))
    print(ratio_line(result), "(the ratio: the median of the rounds' own)")


if __name__ == "__main__":
    main()
