"""`python -m bench.chunks`: chunked no-op handlers (`task(chunk=32)`, issue 27 item 6)
beside Dramatiq 2 × 1 and forq's one-job-per-child no-op, in one run on one private
Redis, rounds interleaved so the machine's noise falls on all three alike.

    .venv/bin/python -m bench.chunks [--jobs 2000] [--rounds 3]

Prints each system's median jobs/s and the ratios; the target is chunked ≥ 3× Dramatiq
2 × 1. The same round is part of `python -m bench` (section e2e, row forq-chunked).
"""

from __future__ import annotations

import argparse

from bench import supervisor as forq_sup
from bench.__main__ import run_driver
from bench.chunk_tasks import CHUNK
from bench.common import RedisServer, log, median
from bench.peers import venv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chunks")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    venv.ensure(log)
    rates: dict[str, list[float]] = {"chunked": [], "forq": [], "dramatiq": []}
    with RedisServer() as server:
        url, base = server.url(0), f"redis://127.0.0.1:{server.port}"
        for i in range(args.rounds):
            log(f"round {i + 1}/{args.rounds}: {args.jobs} no-op jobs each ...")
            rates["chunked"].append(forq_sup.drain_once(
                url, args.jobs, queue_extra="prefetch = 0\n",
                task="bench.noop_chunk",
                imports=("bench.chunk_tasks",))["jobs_per_s"])
            rates["forq"].append(forq_sup.drain_once(
                url, args.jobs, queue_extra="prefetch = 4\n")["jobs_per_s"])
            rates["dramatiq"].append(run_driver("drain", "dramatiq", base, 1, n=args.jobs,
                                                reps=1)["runs"][0])
    m = {k: median(v) for k, v in rates.items()}
    for name, label in (("chunked", f"forq chunked (chunk={CHUNK}), concurrency 2"),
                        ("forq", "forq one job per child, concurrency 2, prefetch 4"),
                        ("dramatiq", "Dramatiq 2 processes × 1 thread")):
        runs = ", ".join(f"{x:,.0f}" for x in rates[name])
        print(f"{label}: {m[name]:,.0f} jobs/s (runs {runs})")
    print(f"chunked / Dramatiq 2×1: {m['chunked'] / m['dramatiq']:.2f}× (target ≥ 3×)")
    print(f"chunked / forq one per child: {m['chunked'] / m['forq']:.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
