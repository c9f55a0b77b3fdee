"""Orchestration: start Redis and the supervisors, run the producer, the fault injector
and the monitor, wait for quiescence, check, report, clean up."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

from forq import Queue
from forq.supervisor.cli import terminal
from forq.units import UnitError, parse_duration

from . import report, soak
from .changes import Operator
from .checker import check
from .context import OTHER_CONCURRENCY, OTHER_QUEUE, QUEUE, Context, Settings, Told
from .faults import KINDS, Injector
from .monitor import Monitor, Probe
from .procs import REPO, Incarnation, RedisProc, SupervisorProc, write_config
from .producer import Producer, client
from .proxy import Proxy

BREAKS = ("drop-job", "double-run", "no-fencing", "early-callback", "leak", "chunk-record")


def parse_args(argv: list[str] | None = None) -> Settings:
    p = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Run forq under load, kill things at random (seeded), and check that "
                    "nothing a producer was told is enqueued is ever lost. Exit 0 only if "
                    "every invariant holds.")
    p.add_argument("--duration", default=None,
                   help="how long to produce jobs and inject faults: 75s (default; 2h with "
                        "--soak)")
    p.add_argument("--supervisors", type=int, default=3, help="supervisor processes (default 3)")
    p.add_argument("--concurrency", type=int, default=6, help="children per supervisor (default 6)")
    p.add_argument("--jobs", type=int, default=None,
                   help="jobs to enqueue (default: rate × duration)")
    p.add_argument("--rate", type=float, default=None, help="jobs per second (default 35)")
    p.add_argument("--slow-ms", default="300-3000",
                   help="chaos.slow jobs last MIN-MAX milliseconds (default 300-3000)")
    p.add_argument("--nested-batches", type=float, default=0.3, metavar="FRACTION",
                   help="share of batches with a member that opens a batch of its own "
                        "(default 0.3; 0: none)")
    p.add_argument("--seed", type=int, default=None, help="seed for jobs and faults (default: random)")
    p.add_argument("--lease-ttl", default="2s", help="supervisors' lease_ttl (default 2s)")
    p.add_argument("--reaper-interval", default="250ms", help="supervisors' reaper_interval")
    p.add_argument("--drain-timeout", default="1500ms", help="supervisors' drain_timeout")
    p.add_argument("--tolerance", default="1s",
                   help="slack on the reclaim bound lease_ttl + reaper_interval (default 1s)")
    p.add_argument("--settle", default="60s", help="bound on the wait for quiescence (default 60s)")
    p.add_argument("--min-each", type=int, default=2, help="each fault kind at least this often")
    p.add_argument("--faults", default="",
                   help=f"comma-separated fault kinds to inject (default all: {','.join(KINDS)})")
    p.add_argument("--break", dest="breaks", default="",
                   help=f"deliberately broken build for the checker's self-test: {', '.join(BREAKS)}")
    p.add_argument("--report", default=None, help="JSON report path (default chaos/reports/...)")
    p.add_argument("--keep", action="store_true", help="keep the run directory (Redis AOF, logs)")
    p.add_argument("--quiet", action="store_true", help="only the final report")
    p.add_argument("--job-cgroups", action="store_true",
                   help='start each supervisor in a fresh cgroup v2 of its own (as systemd '
                        'Delegate=yes would) with job_cgroups = "required": needs root on a '
                        'cgroup v2 host, e.g. the VM: python -m tests.vm -- python -m chaos '
                        '--job-cgroups')
    p.add_argument("--prefetch", type=int, default=0, metavar="N",
                   help="a mixed fleet: the odd-numbered supervisors lease N jobs ahead of "
                        "their free slots ([[queue]].prefetch; 0 leaves the config's "
                        "default, \"auto\")")
    p.add_argument("--soak", action="store_true",
                   help="also look for slow leaks: sample Redis's memory and keys and every "
                        "supervisor's and fork server's RSS and fds, fit a slope to each past "
                        "a warm-up, fail on one that certainly grows; only faults that replace "
                        f"no measured process unless --faults says ({','.join(soak.SOAK_FAULTS)})")
    p.add_argument("--sample-interval", default="60s",
                   help="--soak: time between samples (default 60s)")
    p.add_argument("--warmup", default=None,
                   help="--soak: the start of each process's life that is not judged (default: "
                        "the longest of 3 samples, a quarter of the duration, two retention "
                        "windows)")
    p.add_argument("--breaker-cooldown", default="2s", metavar="DURATION",
                   help="the circuit breaker per task is on (its default count, window and "
                        "ratio) with this cool-down (default 2s); \"off\": no breaker")
    p.add_argument("--namespaces", action="store_true",
                   help="[sandbox].namespaces = true: every job in namespaces of its own "
                        "(needs root or user namespaces)")
    p.epilog = ("A failed run keeps its directory (AOF, logs, execution log); "
                "`python -m chaos --recheck DIR` checks it again.")
    a = p.parse_args(argv)

    def dur(text: str, what: str) -> float:
        try:
            return parse_duration(text, where=what)
        except UnitError as exc:
            p.error(str(exc))
            raise

    faults = tuple(k for k in a.faults.split(",") if k)
    for k in faults:
        if k not in KINDS:
            p.error(f"--faults: unknown fault kind {k!r} (known: {', '.join(KINDS)})")
    breaks = tuple(b for b in a.breaks.split(",") if b)
    for b in breaks:
        if b not in BREAKS:
            p.error(f"--break: unknown mode {b!r} (known: {', '.join(BREAKS)})")
    if not 0 <= a.nested_batches <= 1:
        p.error(f"--nested-batches: a fraction from 0 to 1, got {a.nested_batches:g}")
    if a.supervisors < 1:
        p.error("--supervisors must be >= 1")
    try:
        low, high = (float(x) for x in a.slow_ms.split("-"))
        if not 0 <= low <= high:
            raise ValueError
    except ValueError:
        p.error(f"--slow-ms: expected MIN-MAX milliseconds such as 300-3000, got {a.slow_ms!r}")
    if not 0 <= a.prefetch <= 1000:
        p.error(f"--prefetch: expected 0 to 1000 ([[queue]].prefetch), got {a.prefetch}")
    if "leak" in breaks and not a.soak:
        p.error("--break leak: only a soak (--soak) looks for leaks")
    duration = dur(a.duration or ("2h" if a.soak else "75s"), "--duration")
    interval = dur(a.sample_interval, "--sample-interval")
    if interval <= 0:
        p.error("--sample-interval: must be more than 0")
    warmup = (dur(a.warmup, "--warmup") if a.warmup is not None
              else soak.default_warmup(duration, interval))
    if a.soak and not faults:
        faults = soak.SOAK_FAULTS
    if a.job_cgroups:
        from tests.vm import cgroup_v2_problem

        problem = cgroup_v2_problem()
        if problem:
            p.error(f"--job-cgroups needs root on a cgroup v2 host ({problem}); run it in "
                    "the VM: python -m tests.vm -- python -m chaos --job-cgroups")
    return Settings(
        duration=duration, supervisors=a.supervisors,
        concurrency=a.concurrency, jobs=a.jobs, rate=a.rate,
        seed=a.seed if a.seed is not None else int.from_bytes(os.urandom(3), "big"),
        lease_ttl=dur(a.lease_ttl, "--lease-ttl"),
        reaper_interval=dur(a.reaper_interval, "--reaper-interval"),
        drain_timeout=dur(a.drain_timeout, "--drain-timeout"),
        tolerance=dur(a.tolerance, "--tolerance"), settle=dur(a.settle, "--settle"),
        min_each=a.min_each, faults=faults, breaks=breaks, report=a.report, keep=a.keep,
        quiet=a.quiet, job_cgroups=a.job_cgroups, namespaces=a.namespaces,
        breaker_cooldown="" if a.breaker_cooldown == "off" else a.breaker_cooldown,
        prefetch=a.prefetch, slow_ms=(low, high),
        nested_batches=a.nested_batches, soak=a.soak, sample_interval=interval, warmup=warmup)


def supervisor_env(exec_log: Path, name: str, breaks: tuple[str, ...],
                   leaks: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FORQ_REDIS_URL", "FORQ_REDIS_PASSWORD", "NOTIFY_SOCKET")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["FORQ_CHAOS_EXEC_LOG"] = str(exec_log)
    env["FORQ_CHAOS_SUPERVISOR"] = name
    # built into the supervisors (their handlers)
    inside = [b for b in breaks if b in ("no-fencing", "double-run", "chunk-record")]
    if leaks:
        inside.append("leak")
    if inside:
        env["FORQ_CHAOS_BREAK"] = ",".join(inside)
    else:
        env.pop("FORQ_CHAOS_BREAK", None)
    return env


def _follow(ctx: Context, producer: threading.Thread, duration: float, cap: float) -> None:
    """Wait for the producer (at most `cap` s), with a progress bar on a terminal."""
    begun, shown = time.monotonic(), 0.0
    with terminal.progress(duration, "chaos") as advance:
        while producer.is_alive() and time.monotonic() - begun < cap:
            producer.join(0.5)
            now = min(time.monotonic() - begun, duration)
            advance(now - shown, f"told {len(ctx.told)}, faults {len(ctx.faults)}")
            shown = now


def settle(ctx: Context, bound: float) -> float:
    """Wait until every told job is terminal and nothing is pending, scheduled or active."""
    start = time.monotonic()
    r = client(ctx.redis.url, timeout=5)
    queues = {name: Queue(name, redis=r) for name in (QUEUE, OTHER_QUEUE)}
    last_log = 0.0
    while time.monotonic() - start < bound:
        try:
            pipe = r.pipeline(transaction=False)
            for q in queues.values():
                for key in (q.keys.pending, q.keys.scheduled, q.keys.active):
                    pipe.zcard(key)
            busy = sum(pipe.execute())
            if busy == 0 and ctx.production_done.is_set():
                ids = list(ctx.told)
                pipe = r.pipeline(transaction=False)
                for jid in ids:
                    pipe.hget(queues[ctx.told[jid].queue].keys.job(jid), "state")
                states = pipe.execute()
                # a failed batch's on_success is never enqueued: read after its members
                # (told after them), so its absence is final once theirs are ended
                open_ = [j for j, st in zip(ids, states, strict=True)
                         if st not in ("succeeded", "dead", "cancelled")
                         and not (st is None and ctx.told[j].optional)]
                if not open_ or all(ctx.told[j].status == "dropped" for j in open_):
                    return time.monotonic() - start
            if time.monotonic() - last_log > 5:
                ctx.log(f"settling: {busy} pending/scheduled/active")
                last_log = time.monotonic()
        except (redis.RedisError, OSError) as exc:
            ctx.log(f"settling: redis error {exc}")
        time.sleep(0.25)
    return time.monotonic() - start


def run(s: Settings) -> tuple[int, dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="forq-chaos-"))
    exec_log = workdir / "executions.jsonl"
    exec_log.touch()
    redis_proc = RedisProc(workdir)
    sups = []
    for i in range(1, s.supervisors + 1):
        name = f"chaos-{i}"
        proxy = Proxy(redis_proc.port)  # its own path to Redis, for partitions
        proxy.start()
        cfg = write_config(workdir / f"{name}.toml", name=name, redis_url=proxy.url,
                           lease_ttl=s.lease_ttl, reaper_interval=s.reaper_interval,
                           drain_timeout=s.drain_timeout, concurrency=s.concurrency,
                           queue=QUEUE, others={OTHER_QUEUE: OTHER_CONCURRENCY},
                           max_attempts=s.max_attempts, max_crashes=s.max_crashes,
                           job_cgroups="required" if s.job_cgroups else "auto",
                           namespaces=s.namespaces, prefetch=s.prefetch if i % 2 else 0,
                           defaults="\n".join([soak.RETENTION_DEFAULTS if s.soak else "",
                                                s.breaker_line()]))
        # the leaking build is one supervisor (chaos-2): the others show a flat control
        leaks = "leak" in s.breaks and i == min(2, s.supervisors)
        sups.append(SupervisorProc(name, cfg, workdir / f"{name}.log",
                                   supervisor_env(exec_log, name, s.breaks, leaks),
                                   own_cgroup=s.job_cgroups, proxy=proxy))
    ctx = Context(s, workdir, exec_log, redis_proc, sups)
    wall0 = time.monotonic()
    result: dict[str, Any] = {}
    ok = False
    threads = []
    try:
        ctx.log(f"run dir {workdir}; seed {s.seed}; {s.total_jobs()} jobs at "
                f"{s.job_rate():g}/s over {s.duration:g}s; {s.supervisors} supervisors")
        redis_proc.start()
        for sp in sups:
            sp.start()
        for sp in sups:
            if not sp.wait_ready(30):
                raise RuntimeError(f"supervisor {sp.name} did not start; see {sp.log_path}")
        ctx.started = time.time()
        ctx.log(f"redis on port {redis_proc.port}, supervisors ready")
        monitor = Monitor(ctx)
        producer = Producer(ctx)
        injector = Injector(ctx)
        probe = Probe(ctx)
        operator = Operator(ctx)
        threads = [monitor, producer, injector, probe, operator]
        sampler = soak.Sampler(ctx, s.sample_interval) if s.soak else None
        if sampler is not None:
            threads.append(sampler)
        for t in threads:
            t.start()
        _follow(ctx, producer, s.duration, s.duration + s.settle + 60)
        injector.join(s.duration + 120)
        ctx.log(f"production and faults done: {len(ctx.told)} told, {len(ctx.faults)} faults")
        settle_s = settle(ctx, s.settle)
        ctx.log(f"settled after {settle_s:.1f}s; checking")
        ctx.stop.set()
        monitor.join(10)
        save_context(ctx, settle_s)
        checked = check(ctx)
        ok = checked["ok"] and not ctx.errors
        if sampler is not None:
            sampler.join(10)
            checked["soak"] = soak.judge(
                sampler.samples, interval=s.sample_interval, warmup=s.warmup,
                expected=[f"{sp.name} {role}" for sp in sups
                          for role in ("supervisor", "fork server")])
            ok = ok and checked["soak"]["ok"]
        result = {
            "ok": ok, "settings": vars(s), "settle_s": settle_s, "started": ctx.started,
            "wall_s": time.monotonic() - wall0, **checked,
            "faults": ctx.faults, "redis_outages": ctx.redis_outages,
            "unexpected_exits": ctx.unexpected_exits, "errors": ctx.errors,
            "supervisors": {sp.name: [vars(i) | {"sup_id": i.sup_id} for i in sp.incarnations]
                            for sp in sups},
            "workdir": str(workdir) if (s.keep or not ok) else None,
        }
        result["ok"] = ok  # not the checker's alone: a harness error or a leak fails it too
    except BaseException as exc:
        ctx.errors.append(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        ctx.stop.set()
        for sp in sups:
            try:
                sp.shutdown(timeout=20)
            except Exception as exc:  # noqa: BLE001
                ctx.errors.append(f"stopping {sp.name}: {exc}")
        redis_proc.stop()
        if s.keep or not ok:
            ctx.log(f"run directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return (0 if ok else 1), result


def save_context(ctx: Context, settle_s: float) -> None:
    """What the harness recorded, beside the AOF and the execution log, so a kept run
    directory can be checked again later (``python -m chaos --recheck DIR``)."""
    data = {
        "settings": vars(ctx.settings), "started": ctx.started, "settle_s": settle_s,
        "told": [vars(t) for t in ctx.told.values()], "not_told": ctx.not_told,
        "enqueue_errors": ctx.enqueue_errors, "faults": ctx.faults,
        "redis_outages": ctx.redis_outages, "redis_slow": ctx.redis_slow,
        "monitor_violations": ctx.monitor_violations,
        "unexpected_exits": ctx.unexpected_exits, "samples": ctx.samples[-50:],
        "sched": {str(k): v for k, v in ctx.sched.items()}, "cpu_pressure": ctx.cpu_pressure,
        "errors": ctx.errors, "operator": ctx.operator, "debounce_calls": ctx.debounce_calls,
        "supervisors": [{"name": sp.name, "config": str(sp.config), "log": str(sp.log_path),
                         "incarnations": [vars(i) for i in sp.incarnations]} for sp in ctx.supervisors],
    }
    (ctx.workdir / "context.json").write_text(json.dumps(data, default=str))


def recheck(workdir: Path) -> tuple[int, dict[str, Any]]:
    """Check a kept run directory again: its AOF is loaded into a fresh redis-server."""
    data = json.loads((workdir / "context.json").read_text())
    s = Settings(**{k: tuple(v) if k in ("faults", "breaks") else v
                    for k, v in data["settings"].items()})
    s.quiet = True
    redis_proc = RedisProc(workdir)  # same dir: it loads the AOF; a fresh port
    sups = []
    for sd in data["supervisors"]:
        sp = SupervisorProc(sd["name"], Path(sd["config"]), Path(sd["log"]), {})
        sp.incarnations = [Incarnation(**i) for i in sd["incarnations"]]
        sups.append(sp)
    ctx = Context(s, workdir, workdir / "executions.jsonl", redis_proc, sups)
    ctx.started = data["started"]
    ctx.told = {t["id"]: Told(**t) for t in data["told"]}
    ctx.not_told = data["not_told"]
    ctx.enqueue_errors = data["enqueue_errors"]
    for name in ("faults", "redis_outages", "redis_slow", "monitor_violations", "unexpected_exits",
                 "samples", "cpu_pressure", "errors", "debounce_calls"):
        setattr(ctx, name, data.get(name, []))
    ctx.operator = data.get("operator", {})
    ctx.sched = {int(k): v for k, v in data["sched"].items()}
    redis_proc.start()
    try:
        checked = check(ctx)
    finally:
        redis_proc.stop()
    result = {"settings": vars(s), "settle_s": data["settle_s"], "wall_s": 0.0, **checked,
              "faults": ctx.faults, "redis_outages": ctx.redis_outages,
              "unexpected_exits": ctx.unexpected_exits, "errors": ctx.errors,
              "workdir": str(workdir), "rechecked": True}
    return (0 if checked["ok"] else 1), result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--recheck"]:
        if len(argv) < 2:
            print("usage: python -m chaos --recheck RUN_DIR [--report PATH]", file=sys.stderr)
            return 2
        code, result = recheck(Path(argv[1]))
        path = Path(argv[3]) if argv[2:3] == ["--report"] and len(argv) > 3 \
            else Path(argv[1]) / "recheck.json"
        result["report_path"] = str(path)
        report.write(result, path)
        print(report.render(result))
        return code
    s = parse_args(argv)
    try:
        code, result = run(s)
    except KeyboardInterrupt:
        print("chaos: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    path = Path(s.report) if s.report else report.default_path(s.seed)
    result["report_path"] = str(path)
    report.write(result, path)
    print(report.render(result))
    return code
