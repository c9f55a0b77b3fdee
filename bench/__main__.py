"""`python -m bench`: forq beside RQ, Celery, Dramatiq and BullMQ and beside the machine's
limits, in one run on one private Redis; writes bench/RESULTS.md and bench/results.json.

    .venv/bin/python -m bench                 # full run (about 10 minutes on 2 cores)
    .venv/bin/python -m bench --quick         # smaller N, fewer repetitions (about 4 minutes)
    # both longer when other work loads the machine: 13 and 7 minutes at load 8-32
    .venv/bin/python -m bench --skip-1m       # full run without the 1,000,000-job backlog
    .venv/bin/python -m bench --only e2e,latency

The peers run from their own venv, bench/.venv-peers, created on first use (pip:
rq, celery[redis], dramatiq[redis]); BullMQ from bench/peers/bullmq (`npm ci` there on
first use). forq runs from the interpreter running this.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import report
from bench.chunk_tasks import CHUNK
from bench.common import (
    BENCH,
    REPO,
    RedisServer,
    log,
    machine_info,
    median,
    percentile,
    summary,
)
from bench.peers import venv
from forq.supervisor.cli import terminal

# [[queue]].prefetch of the second forq row of the end-to-end section: what a user with
# short jobs would set (docs/operations/supervisor.md, "Prefetch"); the targets of issue 18 are read from it
PREFETCH = 4
SECTIONS = ("limits", "enqueue", "e2e", "appsize", "latency", "recovery", "scale", "ceiling",
            "leases")


class Sizes:
    def __init__(self, quick: bool, with_1m: bool) -> None:
        self.quick = quick
        self.reps = 2 if quick else 3
        # end to end and latency take fewer rounds than the rest since the application-size
        # section (a full run stays under 10 minutes on 2 cores)
        self.e2e_rounds = 2
        self.latency_rounds = 2 if quick else 3
        self.enqueue_single = 2000 if quick else 5000
        self.enqueue_batch = 10_000 if quick else 20_000
        # no-op jobs drained end to end; the slow forking RQ worker gets fewer
        # (sized to keep a full run under 10 minutes on a 2-core machine)
        self.drain = {"forq": 1000 if quick else 2000, "rq-fork": 200 if quick else 600,
                      "rq-simple": 600 if quick else 1500, "celery": 1000 if quick else 2000,
                      "dramatiq": 1000 if quick else 2000}
        self.profile_jobs = 1500
        self.latency_samples = 20 if quick else 100
        self.recovery_reps = 2 if quick else 3
        self.supervisor_kill_reps = 1 if quick else 2
        self.recovery_cap = 15.0 if quick else 60.0
        self.backlogs = [1000, 100_000] + ([1_000_000] if with_1m else [])
        self.scale_supervisor_jobs = 300 if quick else 1000
        # the Redis ceiling: jobs per system and round (RQ's 8 SimpleWorkers are slow)
        self.ceiling_jobs = 4000 if quick else 10_000
        self.ceiling_reps = 1 if quick else 2
        self.lease_jobs = 300 if quick else 1000  # sleeping jobs held by one supervisor
        from bench.appsize import Sizes as AppSizes

        self.appsize = AppSizes(quick)  # the application-size axis (bench/appsize.py)


def run_driver(mode: str, system: str, redis_base: str, db: int, **options: Any) -> dict:
    """One measurement of one peer, in the peers' venv; returns its JSON."""
    cmd = [str(venv.python()), str(BENCH / "peers" / "driver.py"), mode, "--system", system,
           "--redis", redis_base, "--db", str(db)]
    for key, value in options.items():
        if value != "":
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO), timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{system} {mode} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- sections -----------------------------------------------------------------------------


def section_limits(ctx: dict[str, Any], sz: Sizes) -> dict[str, Any]:
    from bench import limits
    from bench import supervisor as forq_sup

    log("limits: redis-benchmark ...")
    out: dict[str, Any] = {"redis_benchmark": limits.measure(ctx["port"], sz.quick)}
    log("limits: a supervisor's RSS, then fork+waitpid at that size ...")
    rss = forq_sup.idle_rss(ctx["url"])
    out["supervisor_rss_idle"] = rss
    out["fork"] = forq_sup.fork_limit(pad_to=rss or 0, forks=500 if sz.quick else 1000,
                                      reps=5)
    ctx["supervisor_rss_idle"] = rss
    ctx["fork_runs"] = list(out["fork"]["runs"])
    return out


def _forq_enqueue_once(url: str, n_single: int, n_batch: int) -> tuple[float, float]:
    from bench.supervisor import remove_queue
    from forq import Queue
    from forq.store.connection import connect

    r = connect(url)
    q = Queue(f"bench-enq-{os.getpid()}-{time.monotonic_ns()}", redis=r)
    q.enqueue("bench.noop")  # warm: scripts loaded, queue registered
    t0 = time.perf_counter()
    for _ in range(n_single):
        q.enqueue("bench.noop")
    single = n_single / (time.perf_counter() - t0)
    specs = [{"task": "bench.noop"} for _ in range(n_batch)]
    t0 = time.perf_counter()
    q.enqueue_many(specs)
    many = n_batch / (time.perf_counter() - t0)
    remove_queue(r, q.name)
    return single, many


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-repetition driver results (reps=1 each) → one result, medians over the runs."""
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, dict) and "runs" in value:
            vals = [x for r in runs for x in r[key]["runs"]]
            out[key] = dict(value, **summary(vals))
        elif key in ("median", "min", "max", "runs"):
            continue
        else:
            out[key] = value
    if "runs" in runs[0]:
        out.update(summary([x for r in runs for x in r["runs"]]))
    return out


def section_enqueue(ctx: dict[str, Any], sz: Sizes) -> dict[str, Any]:
    """Round-robin over the systems, one repetition each per round: a change in the
    machine's load hits every system alike."""
    from bench import addbulk

    single, many = [], []
    peers: dict[str, list[dict[str, Any]]] = {"rq-simple": [], "celery": [], "dramatiq": []}
    # BullMQ's addBulk beside enqueue_many, each round (issue 27), in its own database
    bullmq_url = f"{ctx['redis_base']}/4" if venv.ensure_node(log) else None
    bulk_rounds: list[addbulk.Round] = []
    for i in range(sz.reps):
        log(f"enqueue: round {i + 1}/{sz.reps}: forq, RQ, Celery, Dramatiq "
            f"({sz.enqueue_single} single, {sz.enqueue_batch} in a batch), forq enqueue_many "
            "and BullMQ addBulk (no-op and mail jobs) ...")
        s1, m1 = _forq_enqueue_once(ctx["url"], sz.enqueue_single, sz.enqueue_batch)
        single.append(s1)
        many.append(m1)
        bulk_rounds.append(addbulk.one_round(ctx["url"], bullmq_url, sz.enqueue_batch))
        log("enqueue: " + addbulk.ratio_line(addbulk.summarize(bulk_rounds[-1:],
                                                                sz.enqueue_batch)))
        for system in peers:  # rq-simple: RQ's producer side
            peers[system].append(run_driver("enqueue", system, ctx["redis_base"], 1,
                                            n=sz.enqueue_single, n_batch=sz.enqueue_batch,
                                            reps=1))
    out: dict[str, Any] = {
        "forq": {"enqueue": dict(summary(single), n=sz.enqueue_single),
                 "enqueue_many": dict(summary(many), n=sz.enqueue_batch)},
    }
    for system, runs in peers.items():
        out["rq" if system.startswith("rq") else system] = _merge(runs)
    out["addbulk"] = addbulk.summarize(bulk_rounds, sz.enqueue_batch)
    if bullmq_url:
        out["bullmq_version"] = venv.bullmq_version()
    log("enqueue: over the rounds: " + addbulk.ratio_line(out["addbulk"]))
    return out


def section_e2e(ctx: dict[str, Any], sz: Sizes) -> dict[str, Any]:
    from bench import supervisor as forq_sup

    systems = ("rq-fork", "rq-simple", "celery", "dramatiq")
    forq_runs: list[dict[str, Any]] = []
    prefetch_runs: list[dict[str, Any]] = []  # the same, with jobs leased ahead of a slot
    events_off_runs: list[dict[str, Any]] = []  # the same, without the queue's events
    chunked_runs: list[dict[str, Any]] = []  # a chunked no-op (`task(chunk=32)`), #27
    peers: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    # the fork limit is measured again in every round: the ratio to it is the target, and
    # a single measurement at the start would carry that moment's noise into it
    rss = ctx.get("supervisor_rss_idle") or forq_sup.idle_rss(ctx["url"]) or 0
    fork_runs: list[float] = []
    for i in range(sz.e2e_rounds):
        log(f"e2e: round {i + 1}/{sz.e2e_rounds}: fork limit, forq {sz.drain['forq']} jobs "
            f"(prefetch 0 and {PREFETCH}), "
            + ", ".join(f"{s} {sz.drain[s]}" for s in systems) + " ...")
        fork_runs += forq_sup.fork_limit(pad_to=rss, forks=500 if sz.quick else 1000,
                                         reps=3)["runs"]
        # prefetch 0 explicitly: the default ("auto") holds jobs in a no-op drain like 4
        forq_runs.append(forq_sup.drain_once(ctx["url"], sz.drain["forq"],
                                             queue_extra="prefetch = 0\n"))
        prefetch_runs.append(forq_sup.drain_once(ctx["url"], sz.drain["forq"],
                                                 queue_extra=f"prefetch = {PREFETCH}\n"))
        events_off_runs.append(forq_sup.drain_once(ctx["url"], sz.drain["forq"],
                                                   queue_extra=forq_sup.EVENTS_OFF))
        chunked_runs.append(forq_sup.drain_once(ctx["url"], sz.drain["forq"],
                                                queue_extra="prefetch = 0\n",
                                                task="bench.noop_chunk",
                                                imports=("bench.chunk_tasks",)))
        for system in systems:
            peers[system].append(run_driver("drain", system, ctx["redis_base"], 1,
                                            n=sz.drain[system], reps=1))
    out: dict[str, Any] = {"forq": forq_sup.throughput_summary(forq_runs, sz.drain["forq"]),
                           "forq-prefetch": dict(forq_sup.throughput_summary(
                               prefetch_runs, sz.drain["forq"]), prefetch=PREFETCH),
                           "forq-events-off": forq_sup.throughput_summary(
                               events_off_runs, sz.drain["forq"]),
                           "forq-chunked": dict(forq_sup.throughput_summary(
                               chunked_runs, sz.drain["forq"]), chunk=CHUNK),
                           "fork_limit_in_rounds": summary(fork_runs)}
    ctx.setdefault("fork_runs", []).extend(fork_runs)
    for system, runs in peers.items():
        out[system] = _merge(runs)
    dramatiq = out["dramatiq"].get("median")
    if dramatiq:
        log(f"e2e: forq chunked (chunk={CHUNK}) {out['forq-chunked']['median']:,.0f} jobs/s, "
            f"{out['forq-chunked']['median'] / dramatiq:.2f}× Dramatiq 2×1 "
            f"({dramatiq:,.0f} jobs/s, same run)")
    if ctx.get("profile"):
        log("e2e: forq once more under py-spy (profile; not counted) ...")
        prof = BENCH / ".profile-supervisor.txt"
        try:
            out["forq_profiled"] = forq_sup.drain_once(ctx["url"], sz.profile_jobs,
                                                       profile_to=prof)
            if prof.exists():
                out["profile"] = report.summarize_py_spy(prof.read_text())
                prof.unlink()
        except Exception as exc:  # noqa: BLE001 — the profile is a bonus
            out["profile_error"] = repr(exc)
    return out


def section_appsize(ctx: dict[str, Any], sz: Sizes) -> dict[str, Any]:
    from bench import appsize

    return appsize.measure(ctx["url"], ctx["redis_base"], sz.appsize, run_driver)


def _merge_latency(runs: list[dict[str, Any]]) -> dict[str, Any]:
    samples = [x for r in runs for x in r["all_ms"]]
    out = dict(runs[-1])
    out.update(samples=len(samples), p50_ms=percentile(samples, 50),
               p99_ms=percentile(samples, 99), max_ms=max(samples), all_ms=samples,
               rounds_p50_ms=[r["p50_ms"] for r in runs])
    after = [x for r in runs for x in r.get("after_all_ms", [])]
    if after:  # from the enqueue call's return, as issue 18 measures it
        out.update(after_p50_ms=percentile(after, 50), after_p99_ms=percentile(after, 99),
                   after_all_ms=after)
    for key in ("claim_p50_ms", "to_claim_p50_ms", "claim_to_start_p50_ms"):
        if key in out:
            out[key] = median(r[key] for r in runs)
    return out


def section_latency(ctx: dict[str, Any], sz: Sizes) -> dict[str, Any]:
    """Rounds of a few samples per system, so a burst of background work hits every
    system alike; the percentiles are over all samples."""
    from bench import supervisor as forq_sup

    systems = ("rq-fork", "rq-simple", "celery", "dramatiq")
    rounds = sz.latency_rounds
    per_round = max(5, sz.latency_samples // rounds)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in ("forq", *systems)}
    for i in range(rounds):
        log(f"latency: round {i + 1}/{rounds}, {per_round} samples each ...")
        runs["forq"].append(forq_sup.latency(ctx["url"], per_round))
        for system in systems:
            runs[system].append(run_driver("latency", system, ctx["redis_base"], 1,
                                           samples=per_round))
    return {system: _merge_latency(r) for system, r in runs.items()}


def section_recovery(ctx: dict[str, Any], sz: Sizes) -> dict[str, Any]:
    from bench import supervisor as forq_sup

    log(f"recovery: forq child SIGKILL x {sz.recovery_reps} ...")
    out: dict[str, Any] = {"forq": {
        "child": forq_sup.child_crash(ctx["url"], sz.recovery_reps)}}
    log(f"recovery: forq supervisor SIGKILL x {sz.supervisor_kill_reps} ...")
    out["forq"]["worker"] = forq_sup.supervisor_crash(ctx["url"], sz.supervisor_kill_reps)
    # the peers' runs are mostly waiting (a 20 s job, a lease or visibility timeout), so
    # they run side by side, each on its own Redis databases
    jobs = []
    db = 2
    for system in ("rq-fork", "celery", "dramatiq"):
        for kind in ("child", "worker"):
            reps = sz.recovery_reps if kind == "child" else 1
            jobs.append((system, kind, db, reps))
            db += 2
    log(f"recovery: {len(jobs)} peer runs side by side (cap {sz.recovery_cap:.0f} s) ...")
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {(s, k): pool.submit(run_driver, "recovery", s, ctx["redis_base"], d,
                                       kind=k, reps=n, cap=sz.recovery_cap)
                   for s, k, d, n in jobs}
        for (system, kind), fut in futures.items():
            try:
                out.setdefault(system, {})[kind] = fut.result()
            except Exception as exc:  # noqa: BLE001
                out.setdefault(system, {})[kind] = {"error": repr(exc)[-2000:]}
    return out


def section_scale(ctx: dict[str, Any], sz: Sizes) -> dict[str, Any]:
    from bench import scale

    return scale.measure(ctx["url"], sz.backlogs, reps=sz.reps,
                         sup_jobs=sz.scale_supervisor_jobs, private=True)


def section_ceiling(ctx: dict[str, Any], sz: Sizes) -> dict[str, Any]:
    from bench import ceiling

    return ceiling.measure(ctx["url"], ctx["redis_base"], sz.ceiling_jobs, procs=8, slots=50,
                           reps=sz.ceiling_reps)


def section_leases(ctx: dict[str, Any], sz: Sizes) -> dict[str, Any]:
    from bench import leases

    log(f"leases: one supervisor holding {sz.lease_jobs} sleeping jobs ...")
    return leases.measure(ctx["url"], sz.lease_jobs, lease_ttl=6.0, window=12.0)


RUNNERS = {"limits": section_limits, "enqueue": section_enqueue, "e2e": section_e2e,
           "appsize": section_appsize,
           "latency": section_latency, "recovery": section_recovery, "scale": section_scale,
           "ceiling": section_ceiling, "leases": section_leases}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller N, fewer repetitions")
    p.add_argument("--skip-1m", action="store_true", help="no 1,000,000-job backlog")
    p.add_argument("--scale-1m", action="store_true", help="the 1M backlog in a --quick run too")
    p.add_argument("--only", help=f"comma-separated sections of {','.join(SECTIONS)}")
    p.add_argument("--profile", action="store_true", help="the py-spy profile in --quick too")
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy profile")
    p.add_argument("--out", default=str(BENCH / "RESULTS.md"))
    p.add_argument("--json", default=str(BENCH / "results.json"))
    args = p.parse_args(argv)
    sections = SECTIONS if not args.only else tuple(s.strip() for s in args.only.split(","))
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    sz = Sizes(args.quick, with_1m=(args.scale_1m or not args.quick) and not args.skip_1m)

    started = time.time()
    venv.ensure(log)
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "mode": "quick" if args.quick else "full",
        "machine": machine_info(),
        "versions": {"peers": venv.versions()},
        "sections": {}, "errors": {}, "load": {},
    }
    with RedisServer() as server:
        import redis as redis_py

        results["versions"]["redis_server"] = server.version()
        results["versions"]["redis_py_forq"] = redis_py.__version__
        results["versions"]["forq"] = _forq_version()
        ctx = {"port": server.port, "url": server.url(0),
               "redis_base": f"redis://127.0.0.1:{server.port}",
               "profile": (args.profile or not args.quick) and not args.no_profile}
        with terminal.progress(len(sections), "bench") as advance:
            for name in sections:
                advance(0, name)
                _section(name, results, ctx, sz, server)
                advance(1)
    # the fork limit every ratio uses: the median of all its measurements in this run
    results["fork_limit"] = median(ctx.get("fork_runs", []))
    results["fork_limit_runs"] = ctx.get("fork_runs", [])
    results["seconds"] = time.time() - started
    Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    Path(args.out).write_text(report.render(results))
    log(f"done in {results['seconds']:.0f} s: {args.out}, {args.json}")
    print(report.summary_table(results))
    return 1 if results["errors"] else 0


def _section(name: str, results: dict[str, Any], ctx: dict[str, Any], sz: Sizes,
             server: RedisServer) -> None:
    t0 = time.time()
    load0 = os.getloadavg()[0]
    try:
        results["sections"][name] = RUNNERS[name](ctx, sz)
    except Exception:  # noqa: BLE001 — one broken section must not lose the rest
        results["errors"][name] = traceback.format_exc()[-4000:]
        log(f"{name} failed:\n{results['errors'][name]}")
    results["load"][name] = {"start": load0, "end": os.getloadavg()[0],
                             "seconds": time.time() - t0}
    server.flushall()


def _forq_version() -> str:
    try:
        from importlib.metadata import version

        return version("forq")
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    sys.exit(main())
