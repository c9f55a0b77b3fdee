"""Admission by memory (`[supervisor] memory_budget`) under a mixed load.

    .venv/bin/python -m bench.memory_budget [--rounds 2] [--small 1500] [--big 4]
        [--big-mib 900] [--budget 2GiB] [--concurrency 8] [--url redis://...]

One supervisor (concurrency 8, `memory_budget` 2 GiB) drains, each round:

* alone: N small jobs (`bench.hold_memory`: 16 MiB resident for 20 ms, memory_limit
  64 MiB);
* mixed: the same N small jobs with K big ones in one burst a third of the way in
  (900 MiB resident for 1.5 s, memory_limit 1 GiB), on the same budget
  (`memory_reserve_after` its default, 10 s);
* the mixed load with no budget: what the budget prevents, and what it costs;
* the control: the mixed load with the budget, but the K "big" jobs touch only 16 MiB
  (the same 1 GiB memory_limit, so admitted one at a time like the big ones, and held
  as long): what the small jobs lose to the slot a long job takes, memory aside.

The three drains of a round run in an order rotated round by round, so a neighbour's
load (this machine is shared) hits each alike; the ratios are each round's, mixed over
the same round's alone, and their median is the figure.

Measured: the small jobs' throughput (their starts, first to last, from the handlers'
own clocks), mixed over alone (target: at least 0.9); the CPU the big jobs themselves
took (their records' cost: touching 900 MiB is CPU the small jobs do not get on two
cores, budget or none); every job succeeded on its
first attempt with no crash (nothing killed for memory); each big job's wait for
room (its start minus its claim); and the peak resident memory of the jobs' processes
(sampled every 20 ms): at most the budget with one, more without. Prints one JSON
object (and a summary on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import uuid
from statistics import median
from typing import Any

from bench.common import (
    ForqSupervisor,
    RedisServer,
    descendants,
    log,
    remove_queue,
    rss_bytes,
    wait_until,
    workdir,
    write_forq_config,
)
from forq import Queue
from forq.store.connection import connect
from forq.units import parse_size

SMALL_MIB, SMALL_S, SMALL_LIMIT = 16, 0.02, "64MiB"
BIG_S, BIG_LIMIT = 1.5, "1GiB"


class PeakRss:
    """The largest sum of resident memory of a supervisor's job processes (its fork
    server excluded: it holds no job's memory), sampled in a thread."""

    def __init__(self, pid: int, server_pids: set[int]) -> None:
        self.pid, self.skip, self.peak = pid, server_pids, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(0.02):
            total = sum(rss_bytes(p) or 0 for p in descendants(self.pid) if p not in self.skip)
            self.peak = max(self.peak, total)

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def drain(url: str, small: int, big: int, big_mib: int, budget: str | None,
          concurrency: int, huge_pages: bool = True) -> dict[str, Any]:
    """One drain of `small` small jobs and `big` jobs of `big_mib` MiB (memory_limit
    1 GiB) a third of the way in, on `budget` (None: no budget)."""
    r = connect(url)
    name = f"bench-membudget-{uuid.uuid4().hex[:8]}"
    q = Queue(name, redis=r)
    small_spec = {"task": "bench.hold_memory", "args": [SMALL_MIB, SMALL_S],
                  "memory_limit": SMALL_LIMIT}
    big_spec = {"task": "bench.hold_memory", "args": [big_mib, BIG_S], "memory_limit": BIG_LIMIT}
    # the big ones together, a third of the way in: without a budget they all run at once
    specs: list[dict[str, Any]] = [small_spec] * small
    specs[small // 3:small // 3] = [big_spec] * big
    ids = [job.id for job in q.enqueue_many(specs)]
    kinds = ["big" if spec is big_spec else "small" for spec in specs]
    wd = workdir()
    extra = f'memory_budget = "{budget}"' if budget else ""
    extra += "" if huge_pages else "\nhuge_pages = false"
    cfg = write_forq_config(wd / f"{name}.toml", url, name, concurrency,
                            supervisor_extra=extra, queue_extra="prefetch = 0\n")
    sup = ForqSupervisor(cfg, wd / f"{name}.log")
    try:
        sup.start()
        servers = set(descendants(sup.pid))  # before any job: the fork server and spares
        with PeakRss(sup.pid, servers) as peak:
            wait_until(lambda: q.stats()["succeeded"] + q.stats()["dead"] >= len(ids), 600,
                       0.05, "the load drained")
        jobs = [q.get(job_id) for job_id in ids]
    finally:
        sup.stop()
    bad = [j.id for j in jobs if j.state != "succeeded" or j.attempts != 1 or j.crashes]
    starts = sorted(float(j.result) for j, kind in zip(jobs, kinds, strict=True)
                    if kind == "small")
    waits, runs, big_cpu_ms = [], [], 0
    for j, kind in zip(jobs, kinds, strict=True):
        if kind == "big":
            claimed = next(h["at"] for h in j.history if h["event"] == "claimed")
            waits.append(round(float(j.result) - float(claimed), 3))
            cost = j.cost or {}
            big_cpu_ms += cost.get("cpu_user_ms", 0) + cost.get("cpu_system_ms", 0)
            runs.append(round(cost.get("wall_ms", 0) / 1000, 2))
    remove_queue(r, name)
    return {"budget": budget, "small_per_s": round((len(starts) - 1) / (starts[-1] - starts[0]), 1),
            "small_s": round(starts[-1] - starts[0], 2), "big_cpu_s": round(big_cpu_ms / 1000, 2),
            "big_waits_s": waits, "big_runs_s": runs, "peak_rss_mib": peak.peak >> 20, "not_clean": bad[:10],
            "not_clean_count": len(bad)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--small", type=int, default=1500)
    ap.add_argument("--big", type=int, default=4)
    ap.add_argument("--big-mib", type=int, default=900)
    ap.add_argument("--budget", default="2GiB")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--huge-pages", choices=("on", "off"), default="on",
                    help="[supervisor].huge_pages (on: the default)")
    ap.add_argument("--url")
    args = ap.parse_args(argv)
    server = None if args.url else RedisServer().start()
    url = args.url or server.url()  # type: ignore[union-attr]
    try:
        alone: list[dict[str, Any]] = []
        mixed: list[dict[str, Any]] = []
        unbudgeted: list[dict[str, Any]] = []
        control: list[dict[str, Any]] = []
        ways = [(alone, 0, args.big_mib, args.budget), (mixed, args.big, args.big_mib, args.budget),
                (unbudgeted, args.big, args.big_mib, None), (control, args.big, SMALL_MIB, args.budget)]
        for rnd in range(args.rounds):  # rotated: a neighbour's load hits all alike
            for runs, big, big_mib, budget in ways[rnd % 4:] + ways[:rnd % 4]:
                runs.append(drain(url, args.small, big, big_mib, budget, args.concurrency,
                                  args.huge_pages == "on"))
            log(f"round {rnd + 1}: alone {alone[-1]['small_per_s']}/s, mixed "
                f"{mixed[-1]['small_per_s']}/s (no budget {unbudgeted[-1]['small_per_s']}/s, "
                f"control {control[-1]['small_per_s']}/s), "
                f"big waits {mixed[-1]['big_waits_s']} s, runs {mixed[-1]['big_runs_s']} s "
                f"(control {control[-1]['big_runs_s']} s), peak {mixed[-1]['peak_rss_mib']} MiB "
                f"(no budget {unbudgeted[-1]['peak_rss_mib']} MiB)")
    finally:
        if server is not None:
            server.stop()
    alone_rate = median(r["small_per_s"] for r in alone)
    mixed_rate = median(r["small_per_s"] for r in mixed)
    free_rate = median(r["small_per_s"] for r in unbudgeted)
    # each round's ratios (the drains of a round ran back to back)
    over_alone = [round(m["small_per_s"] / a["small_per_s"], 3)
                  for m, a in zip(mixed, alone, strict=True)]
    free_over_alone = [round(u["small_per_s"] / a["small_per_s"], 3)
                       for u, a in zip(unbudgeted, alone, strict=True)]
    control_over_alone = [round(c["small_per_s"] / a["small_per_s"], 3)
                          for c, a in zip(control, alone, strict=True)]
    # the share of the two cores' time, over the small jobs' span, the big jobs took
    big_share = median(m["big_cpu_s"] / (2 * m["small_s"]) for m in mixed)
    result = {
        "budget": args.budget, "budget_mib": parse_size(args.budget) >> 20,
        "huge_pages": args.huge_pages,
        "small_jobs": args.small, "big_jobs": args.big, "big_mib": args.big_mib,
        "concurrency": args.concurrency,
        "small_per_s_alone": alone_rate, "small_per_s_mixed": mixed_rate,
        "small_per_s_mixed_no_budget": free_rate,
        "ratio_mixed_over_alone": median(over_alone),
        "ratios_mixed_over_alone": over_alone,
        "ratio_no_budget_over_alone": median(free_over_alone),
        "ratios_no_budget_over_alone": free_over_alone,
        # the same schedule with 16 MiB "big" jobs: the part of the loss that is the slot
        "ratio_control_over_alone": median(control_over_alone),
        "ratios_control_over_alone": control_over_alone,
        "big_cpu_s": median(m["big_cpu_s"] for m in mixed),
        "big_cpu_share_of_two_cores": round(big_share, 3),
        # what admission itself costs the small jobs: the same mixed load without a budget
        "ratio_budget_over_no_budget": round(mixed_rate / free_rate, 3),
        "big_wait_s_max": max(w for r in mixed for w in r["big_waits_s"]),
        "peak_rss_mib_budgeted": max(r["peak_rss_mib"] for r in mixed),
        "peak_rss_mib_unbudgeted": max(r["peak_rss_mib"] for r in unbudgeted),
        "jobs_not_clean": sum(r["not_clean_count"] for r in alone + mixed + unbudgeted + control),
        "rounds": {"alone": alone, "mixed": mixed, "unbudgeted": unbudgeted, "control": control},
    }
    log(f"small jobs/s alone {alone_rate}, mixed {mixed_rate}: ratio (median of the rounds' "
        f"{over_alone}) {result['ratio_mixed_over_alone']} (target >= 0.9); the same mix "
        f"with no budget {free_rate} (of alone {result['ratio_no_budget_over_alone']}, rounds "
        f"{free_over_alone}); the control (the big jobs' slots, 16 MiB each) of alone "
        f"{result['ratio_control_over_alone']} (rounds {control_over_alone}); the big jobs' own CPU {result['big_cpu_s']} s, "
        f"{100 * big_share:.0f}% of two cores over the small jobs' span; big jobs' longest wait for room "
        f"{result['big_wait_s_max']} s; jobs' peak RSS {result['peak_rss_mib_budgeted']} MiB "
        f"on a {result['budget_mib']} MiB budget, {result['peak_rss_mib_unbudgeted']} MiB "
        f"with none; jobs not succeeded first time: {result['jobs_not_clean']}")
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
