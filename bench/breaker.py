"""The circuit breaker per task (docs/guide/breaker.md): the rest of a queue's
throughput while one of its tasks segfaults every job, against the same queue without
that task, in one run.

    .venv/bin/python -m bench.breaker [--good 1000] [--bad 250] [--rounds 3]
        [--concurrency 4] [--url redis://...]

One supervisor drains one queue, each round, three ways (their order rotated round by
round, so a neighbour's load hits all alike):

* clean: `--good` jobs of a good task (`bench.stamp`: returns when its handler began);
* breaker: the same good jobs with `--bad` jobs of a task that segfaults every job
  (`bench.segv`) spread among them (every few jobs one), the breaker at its defaults
  (20 distinct jobs ending the same way in 60 s trip it); `max_crashes = 5`;
* no breaker: the same mix with `[tasks."bench.segv"] breaker = { failures = 0 }`: every
  bad job crashes 5 times before it is dead.

Measured: the good jobs' throughput (their handlers' starts, first to last), each
mixed way over clean in the same round, the median of the rounds' ratios; how many
times bad jobs ran (crashes) before the trip; the bad jobs parked (breaker) or dead (no
breaker) at the end. Prints one JSON object (and a summary on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from statistics import median
from typing import Any

from bench.common import (
    ForqSupervisor,
    RedisServer,
    log,
    remove_queue,
    wait_until,
    workdir,
    write_forq_config,
)
from forq import Queue
from forq.store.connection import connect

WAYS = ("clean", "breaker", "no_breaker")
NO_BREAKER = '[tasks."bench.segv"]\nbreaker = { failures = 0 }\n'


def drain(url: str, way: str, good: int, bad: int, concurrency: int) -> dict[str, Any]:
    r = connect(url)
    name = f"bench-breaker-{uuid.uuid4().hex[:8]}"
    q = Queue(name, redis=r)
    specs: list[dict[str, Any]] = [{"task": "bench.stamp"}] * good
    if way != "clean" and bad:
        every = max(1, good // bad)  # one bad job every few good ones, from the start
        for k in range(bad):
            specs.insert(k * (every + 1), {"task": "bench.segv"})
    ids = [job.id for job in q.enqueue_many(specs)]
    good_ids = [i for i, s in zip(ids, specs, strict=True) if s["task"] == "bench.stamp"]
    bad_ids = [i for i, s in zip(ids, specs, strict=True) if s["task"] == "bench.segv"]
    wd = workdir()
    cfg = write_forq_config(wd / f"{name}.toml", url, name, concurrency,
                            extra=NO_BREAKER if way == "no_breaker" else "")
    sup = ForqSupervisor(cfg, wd / f"{name}.log")
    try:
        sup.start()
        wait_until(lambda: q.stats()["succeeded"] >= good, 600, 0.05, "the good jobs ran")
        stats = q.stats()
        jobs = [q.get(job_id) for job_id in good_ids]
        bad_jobs = [q.get(job_id) for job_id in bad_ids]
        trips = [e.at for e in q.events() if e.kind == "tripped"]
    finally:
        sup.stop()
    starts = sorted(float(j.result) for j in jobs)
    remove_queue(r, name)
    # after the trip (its event's time, Redis's clock, the same machine's): the steady
    # state, the bad task's jobs parked as claims meet them
    after = [t for t in starts if trips and t >= trips[0]]
    return {
        "way": way, "good_per_s": round((len(starts) - 1) / (starts[-1] - starts[0]), 1),
        "seconds": round(starts[-1] - starts[0], 2),
        "tripped_after_s": round(trips[0] - starts[0], 2) if trips else None,
        "good_per_s_after_trip": (round((len(after) - 1) / (after[-1] - after[0]), 1)
                                  if len(after) > 1 and after[-1] > after[0] else None),
        "bad_runs": sum(j.crashes for j in bad_jobs),  # each run crashed: its crashes
        "bad_dead": sum(j.state == "dead" for j in bad_jobs),
        "bad_parked": sum(bool(j.fields.get("parked")) for j in bad_jobs),
        "tripped": sorted(stats.get("tripped") or {}),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--good", type=int, default=1000)
    ap.add_argument("--bad", type=int, default=250)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--url")
    args = ap.parse_args(argv)
    server = None if args.url else RedisServer().start()
    url = args.url or server.url()  # type: ignore[union-attr]
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    try:
        for rnd in range(args.rounds):
            order = WAYS[rnd % 3:] + WAYS[:rnd % 3]
            for way in order:
                runs[way].append(drain(url, way, args.good, args.bad, args.concurrency))
            log(f"round {rnd + 1}: good jobs/s clean {runs['clean'][-1]['good_per_s']}, "
                f"with the bad task {runs['breaker'][-1]['good_per_s']} (bad runs "
                f"{runs['breaker'][-1]['bad_runs']}, tripped {runs['breaker'][-1]['tripped']}), "
                f"no breaker {runs['no_breaker'][-1]['good_per_s']} (bad runs "
                f"{runs['no_breaker'][-1]['bad_runs']})")
    finally:
        if server is not None:
            server.stop()

    def ratios(way: str) -> list[float]:  # each round's way over its clean drain
        return [round(m["good_per_s"] / c["good_per_s"], 3)
                for m, c in zip(runs[way], runs["clean"], strict=True)]

    result = {
        "good_jobs": args.good, "bad_jobs": args.bad, "concurrency": args.concurrency,
        "rounds": args.rounds,
        "good_per_s": {way: median(r["good_per_s"] for r in runs[way]) for way in WAYS},
        "ratio_breaker_over_clean": median(ratios("breaker")),
        "ratios_breaker_over_clean": ratios("breaker"),
        "ratio_after_trip_over_clean": median(
            round(m["good_per_s_after_trip"] / c["good_per_s"], 3)
            for m, c in zip(runs["breaker"], runs["clean"], strict=True)
            if m["good_per_s_after_trip"]),
        "ratio_no_breaker_over_clean": median(ratios("no_breaker")),
        "ratios_no_breaker_over_clean": ratios("no_breaker"),
        "bad_runs_breaker": median(r["bad_runs"] for r in runs["breaker"]),
        "bad_runs_no_breaker": median(r["bad_runs"] for r in runs["no_breaker"]),
        "runs": runs,
    }
    log(f"good jobs/s: clean {result['good_per_s']['clean']}, beside a task that "
        f"segfaults every job {result['good_per_s']['breaker']} with the breaker "
        f"(ratio {result['ratio_breaker_over_clean']}, rounds "
        f"{result['ratios_breaker_over_clean']}; {result['bad_runs_breaker']} bad runs "
        f"before it tripped; after the trip {result['ratio_after_trip_over_clean']}), {result['good_per_s']['no_breaker']} without (ratio "
        f"{result['ratio_no_breaker_over_clean']}; {result['bad_runs_no_breaker']} bad runs)")
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
