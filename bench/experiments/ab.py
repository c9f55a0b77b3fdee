"""A/B of `forq run` variants (bench/experiments/patched_run.py), interleaved so that a
change in the machine's load hits every variant alike.

    .venv/bin/python -m bench.experiments.ab [--jobs N] [--rounds R] [--latency|--split] VARIANT...

A VARIANT is a FORQ_PATCHES value ("" = as is), optionally "|NICE" for the queue's nice.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench import common
from bench import supervisor as forq_sup
from bench.common import RedisServer
from forq.connection import connect
from forq.scripts import TRANSITIONS, source

LAUNCHER = Path(__file__).with_name("patched_run.py")


def latency_split(url: str, samples: int, patches: str) -> None:
    """Where one job's pick-up time goes, from the `marks` patch and `bench.stamp_env`."""
    import json
    import random
    import statistics
    import time

    from forq import Queue

    os.environ["FORQ_PATCHES"] = ",".join(filter(None, [patches, "marks"]))
    r = connect(url)
    q = Queue(f"bench-split-{os.getpid()}", redis=r)
    cfg = common.write_forq_config(common.workdir() / "split.toml", url, q.name, 2)
    rows = []
    with PatchedSupervisor(cfg):
        time.sleep(0.5)
        q.enqueue("bench.noop")
        time.sleep(0.3)
        for _ in range(samples):
            t0 = time.time()
            job = q.enqueue("bench.stamp_env")
            t_enq = time.time()
            key = q.keys.job(job.id)
            common.wait_until(lambda k=key: r.hget(k, "state") == "succeeded", 30, 0.002)
            res = json.loads(r.hget(key, "result"))

            def at(name: str, res: dict = res) -> float:
                # marks set in the child are missing when a fork server forks it
                return float(res.get(name, "nan"))

            rows.append({
                "enqueue call": t_enq - t0,
                "→ claim reply parsed": at("BENCH_REPLY_AT") - t_enq,
                "reply → fork called": at("BENCH_FORK_AT") - at("BENCH_REPLY_AT"),
                "fork → run_child starts": at("BENCH_CHILD_RUN") - at("BENCH_FORK_AT"),
                "_die_with_parent (prctl)": at("BENCH_CHILD_START") - at("BENCH_CHILD_RUN"),
                "_isolate": at("BENCH_AFTER_ISOLATE") - at("BENCH_CHILD_START"),
                "title + _sandbox": at("BENCH_BEFORE_LIMIT") - at("BENCH_AFTER_ISOLATE"),
                "_limit (rlimits, nice)": at("BENCH_AFTER_LIMIT") - at("BENCH_BEFORE_LIMIT"),
                "→ handler": res["t"] - at("BENCH_AFTER_LIMIT"),
                "total": res["t"] - t0,
            })
            time.sleep(random.uniform(0.02, 0.05))
    for name in rows[0]:
        values = sorted(row[name] * 1000 for row in rows)
        if values[0] != values[0]:  # nan
            continue
        print(f"{name:28} p50 {statistics.median(values):7.3f} ms   "
              f"p90 {values[int(len(values) * 0.9)]:7.3f} ms")


class PatchedSupervisor(common.ForqSupervisor):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.command = [common.FORQ_PYTHON, str(LAUNCHER)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("variants", nargs="+")
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--latency", action="store_true", help="pick-up latency instead")
    p.add_argument("--split", action="store_true",
                   help="split pick-up latency into steps (marks patch), per variant")
    args = p.parse_args(argv)
    forq_sup.ForqSupervisor = PatchedSupervisor
    with RedisServer() as server:
        url = server.url()
        r = connect(url)
        for name in TRANSITIONS:  # noscriptexists needs them loaded
            r.script_load(source(name))
        if args.split:
            for variant in args.variants:
                print(f"-- {variant or 'as is'}")
                latency_split(url, args.jobs, variant.partition("|")[0])
            return 0
        rss = forq_sup.idle_rss(url) or 0
        limit = forq_sup.fork_limit(pad_to=rss)
        print(f"fork limit at {rss / 2**20:.1f} MiB: {limit['forks_per_s']:.0f}/s "
              f"(runs {', '.join(f'{x:.0f}' for x in limit['runs'])})", flush=True)
        for _ in range(args.rounds):
            for variant in args.variants:
                patches, _, nice = variant.partition("|")
                os.environ["FORQ_PATCHES"] = patches
                extra = f"nice = {nice}" if nice else ""
                label = variant or "as is"
                if args.latency:
                    x = forq_sup.latency(url, args.jobs, queue_extra=extra)
                    print(f"{label:50} p50 {x['p50_ms']:.2f} ms, p99 {x['p99_ms']:.2f} ms, "
                          f"to claim {x['to_claim_p50_ms']:.2f}, claim→handler "
                          f"{x['claim_to_start_p50_ms']:.2f}; load {os.getloadavg()[0]:.1f}",
                          flush=True)
                    continue
                x = forq_sup.drain_once(url, args.jobs, queue_extra=extra)
                print(f"{label:50} {x['jobs_per_s']:6.1f} jobs/s; supervisor "
                      f"{x['parent_user_ms_per_job']:.2f}+{x['parent_sys_ms_per_job']:.2f} ms, "
                      f"{x['parent_minor_faults_per_job']:.0f} faults; children "
                      f"{x['children_cpu_ms_per_job']:.2f} ms; RSS "
                      f"{x['supervisor_rss'] / 2**20:.1f} MiB; "
                      f"{x['redis_commands_per_job']['total']:.1f} cmds/job; "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
