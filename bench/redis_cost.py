"""A lone supervisor's Redis cost per job, its pick-up latency and its idle CPU (issue 27,
items 4 and 5), with a baseline measured in the same run.

    .venv/bin/python -m bench.redis_cost                        # 2,000 jobs, 3 rounds
    .venv/bin/python -m bench.redis_cost --baseline /work/main/.venv/bin/python
    .venv/bin/python -m bench.redis_cost --jobs 500 --rounds 1 --samples 30 --idle 10

One private redis-server. The production defaults (a compact succeeded record, the
queue's events on, job cost metered), no-op jobs, concurrency 2:

* **Redis cost per job**: N no-op jobs enqueued first, then a supervisor drains them,
  with `prefetch = 0` (a claim per freed slot) and the default `prefetch = "auto"`;
  between its first finished job and its last, per job: the commands Redis ran (INFO
  commandstats, those run inside the scripts included; the benchmark's polling left
  out), Redis's CPU (INFO cpu, user + sys: the whole process, its event loop and
  system calls included) and the scripts' own time (commandstats' EVALSHA usec, the
  commands they ran included). Targets: ≤ 12 commands and ≤ 60 µs of Redis CPU.
* **The scripts alone**, the same shape without a supervisor (no scheduling noise):
  `--jobs` no-op jobs, each claimed alone and acked alone (a supervisor with a free slot
  at a time), the calls pipelined 100 at a time with the supervisor's policy and a
  cost: commands, Redis CPU and EVALSHA µs per job.
* **Pick-up latency** from the enqueue's return (`bench.supervisor.latency`: one job at
  a time on an idle supervisor). Targets: p50 ≤ 2 ms, p99 ≤ 5 ms.
* **Idle CPU**: a supervisor with no jobs, `--idle` seconds after it settled: CPU
  seconds (user + sys from /proc) of the supervisor and of its fork server and spares,
  and the Redis CPU and commands its idle loop costs (its reaper passes, heartbeats).

`--baseline PYTHON` runs the same rounds with another checkout's venv python as the
supervisor (e.g. the main branch), alternating with this one: each figure beside its
baseline and their ratio. The producer is always this checkout.
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
    ForqSupervisor,
    RedisServer,
    command_calls,
    command_usec,
    descendants,
    log,
    median,
    redis_cpu_seconds,
    workdir,
    write_forq_config,
)
from bench.supervisor import _proc_stat, drain_once, latency  # noqa: E402
from forq.store.connection import connect  # noqa: E402

TARGET_COMMANDS = 12.0
TARGET_REDIS_US = 60.0
TARGET_P50_MS = 2.0
TARGET_P99_MS = 5.0
COST = "3,0,15437824,7,3"  # a no-op child's cost, as a supervisor reports it
PREFETCH = {"0": "prefetch = 0\n", "auto": ""}  # "auto" is the default


def _cpu(pid: int) -> float:
    st = _proc_stat(pid)
    return st["user"] + st["sys"]


def idle_cpu(url: str, seconds: float, python: str | None = None) -> dict[str, Any]:
    """CPU seconds of an idle supervisor (and its fork server, spares) over `seconds`,
    and what its idle loop costs Redis."""
    name = f"bench-idle-{uuid.uuid4().hex[:8]}"
    cfg = write_forq_config(workdir() / f"{name}.toml", url, name, 2, keep_history=None)
    sup = ForqSupervisor(cfg, workdir() / f"{name}.log")
    if python:
        sup.command = [python, *sup.command[1:]]
    r = connect(url)
    with sup.start():
        time.sleep(3.0)  # start-up done: the fork server's spares forked
        pids = [sup.pid, *descendants(sup.pid)]
        cpu1 = {pid: _cpu(pid) for pid in pids}
        rcpu1, calls1 = redis_cpu_seconds(r), command_calls(r)
        time.sleep(seconds)
        rcpu2, calls2 = redis_cpu_seconds(r), command_calls(r)
        cpu2 = {}
        for pid in pids:
            try:
                cpu2[pid] = _cpu(pid)
            except OSError:  # a spare retired meanwhile: its CPU is lost, say so
                cpu2[pid] = cpu1[pid]
    own = cpu2[sup.pid] - cpu1[sup.pid]
    helpers = sum(cpu2[p] - cpu1[p] for p in pids if p != sup.pid)
    calls = sum(v - calls1.get(k, 0) for k, v in calls2.items() if k != "info")
    return {"seconds": seconds, "supervisor_cpu_s": own, "helpers_cpu_s": helpers,
            "processes": len(pids), "share_of_a_core": (own + helpers) / seconds,
            "redis_cpu_s": rcpu2 - rcpu1, "redis_commands_per_s": calls / seconds}


def scripts_alone(url: str, jobs: int, texts: dict[str, str]) -> dict[str, Any]:
    """claim 1 + ack 1 per job, as a lone supervisor's calls, pipelined; `texts`: the
    claim and ack scripts to run (this checkout's, or a baseline's)."""
    from forq import Queue
    from forq.store import transitions as tr
    from forq.supervisor.config.load import load_config

    name = f"bench-scripts-{uuid.uuid4().hex[:8]}"
    cfg = write_forq_config(workdir() / f"{name}.toml", url, name, 2, keep_history=None)
    policy = json.dumps(load_config(cfg).job_policy(name))
    r = connect(url)
    q = Queue(name, redis=r)
    sha = {k: r.script_load(v) for k, v in texts.items()}

    def run(pipe: Any, call: Any) -> None:
        pipe.evalsha(sha[call.script], len(call.keys), *call.keys, *call.args)

    for start in range(0, jobs, 5000):
        q.enqueue_many([{"task": "bench.noop"}] * min(5000, jobs - start))
    rcpu1, n1, u1 = redis_cpu_seconds(r), command_calls(r), command_usec(r)
    leases: list[tuple[str, str]] = []
    for start in range(0, jobs, 100):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(100, jobs - start)):
            run(pipe, tr.claim_call(q.keys, "bench:1", 1, 60_000, policy, "bench"))
        for reply in pipe.execute():
            leases += [(lease.job.id, lease.token) for lease in tr.parse_claim(reply).leases]
    for start in range(0, len(leases), 100):
        pipe = r.pipeline(transaction=False)
        for job_id, token in leases[start:start + 100]:
            run(pipe, tr.ack_many_call(q.keys, [(job_id, token, "null", (), COST)]))
        assert all(a == "ok" for a in pipe.execute())
    rcpu2, n2, u2 = redis_cpu_seconds(r), command_calls(r), command_usec(r)
    assert len(leases) == jobs, f"claimed {len(leases)} of {jobs}"
    per = {k: (v - n1.get(k, 0)) / jobs for k, v in n2.items() if k != "info"}
    per = {k: v for k, v in per.items() if v > 0}
    return {"commands": sum(per.values()),
            "top": {k: round(v, 2) for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:14]},
            "redis_cpu_us": (rcpu2 - rcpu1) / jobs * 1e6,
            "script_us": (u2.get("evalsha", 0) - u1.get("evalsha", 0)) / jobs}


def script_texts(commit: str | None) -> dict[str, str]:
    """claim's and ack's text, includes pasted: this checkout's, or at `commit`."""
    from bench.luaprologue import reader_at
    from forq.store.scripts import expand, source

    if commit is None:
        return {name: source(name) for name in ("claim", "ack")}
    return {name: expand(name, reader_at(commit)) for name in ("claim", "ack")}


def drain(url: str, jobs: int, prefetch: str, python: str | None) -> dict[str, Any]:
    out = drain_once(url, jobs, queue_extra=PREFETCH[prefetch], keep_history=None,
                     python=python)
    return {"jobs_per_s": out["jobs_per_s"],
            "commands": out["redis_commands_per_job"]["total"],
            "top": out["redis_commands_per_job"]["top"],
            "redis_cpu_us": out["redis_cpu_ms_per_job"] * 1000,
            "script_us": out["redis_script_us_per_job"]}


def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    sides = {"this": None}
    if args.baseline:
        sides["baseline"] = args.baseline
    cost: dict[str, dict[str, list[dict[str, Any]]]] = {
        s: {p: [] for p in PREFETCH} for s in sides}
    for i in range(args.rounds if args.drains is None else args.drains):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for prefetch in PREFETCH:
            for side in order:
                log(f"redis_cost: round {i + 1}/{args.rounds}, {side}, prefetch {prefetch}")
                cost[side][prefetch].append(drain(url, args.jobs, prefetch, sides[side]))
    out: dict[str, Any] = {"jobs": args.jobs, "rounds": args.rounds, "cost": cost,
                           "latency": {}, "idle": {}, "scripts": []}
    texts = {"this": script_texts(None)}
    if args.base_commit:
        texts["baseline"] = script_texts(args.base_commit)
    out["scripts"] = {side: [] for side in texts}
    for i in range(args.rounds):
        for side in (list(texts) if i % 2 == 0 else list(reversed(texts))):
            log(f"redis_cost: the scripts alone, round {i + 1}/{args.rounds}, {side}")
            out["scripts"][side].append(scripts_alone(url, args.jobs, texts[side]))
    for side, python in sides.items():
        if args.samples:
            log(f"redis_cost: pick-up latency, {side}")
            out["latency"][side] = latency(url, args.samples, keep_history=None, python=python)
        if args.idle:
            log(f"redis_cost: idle CPU over {args.idle:g} s, {side}")
            out["idle"][side] = idle_cpu(url, args.idle, python)
    return out


def _med(runs: list[dict[str, Any]], key: str) -> float:
    return median(r[key] for r in runs) or 0.0


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×" if b else "—"


def report(res: dict[str, Any]) -> None:
    cost = res["cost"]
    print(f"\nA lone supervisor, concurrency 2, no-op jobs, defaults ({res['jobs']} jobs, "
          f"{res['rounds']} rounds; medians)")
    print(f"{'':<22}{'commands/job':>14}{'÷ target 12':>12}{'Redis CPU µs':>14}"
          f"{'÷ target 60':>12}{'scripts µs':>12}{'jobs/s':>9}")
    for prefetch in PREFETCH:
        if not cost["this"][prefetch]:
            continue
        for side, by in cost.items():
            runs = by[prefetch]
            c, u = _med(runs, "commands"), _med(runs, "redis_cpu_us")
            print(f"{side + ', prefetch ' + prefetch:<22}{c:>14.2f}"
                  f"{_ratio(c, TARGET_COMMANDS):>12}{u:>14.1f}{_ratio(u, TARGET_REDIS_US):>12}"
                  f"{_med(runs, 'script_us'):>12.1f}{_med(runs, 'jobs_per_s'):>9.0f}")
        if "baseline" in cost:
            a, b = cost["this"][prefetch], cost["baseline"][prefetch]
            print(f"{'  this ÷ baseline':<22}{_ratio(_med(a, 'commands'), _med(b, 'commands')):>14}"
                  f"{'':>12}{_ratio(_med(a, 'redis_cpu_us'), _med(b, 'redis_cpu_us')):>14}"
                  f"{'':>12}{_ratio(_med(a, 'script_us'), _med(b, 'script_us')):>12}")
        if cost["this"][prefetch]:
            print(f"  most frequent (this): {cost['this'][prefetch][-1]['top']}")
    for side, sc in res["scripts"].items():
        c, u = _med(sc, "commands"), _med(sc, "redis_cpu_us")
        print(f"{'scripts alone, ' + side:<22}{c:>14.2f}{_ratio(c, TARGET_COMMANDS):>12}"
              f"{u:>14.1f}{_ratio(u, TARGET_REDIS_US):>12}{_med(sc, 'script_us'):>12.1f}")
        print(f"  most frequent: {sc[-1]['top']}")
    if "baseline" in res["scripts"]:
        a, b = res["scripts"]["this"], res["scripts"]["baseline"]
        print(f"{'  this ÷ baseline':<22}{_ratio(_med(a, 'commands'), _med(b, 'commands')):>14}"
              f"{'':>12}{_ratio(_med(a, 'redis_cpu_us'), _med(b, 'redis_cpu_us')):>14}"
              f"{'':>12}{_ratio(_med(a, 'script_us'), _med(b, 'script_us')):>12}")
    for side, lat in res["latency"].items():
        if lat:
            ok50 = "met" if _p(lat, 50) <= TARGET_P50_MS else "missed"
            ok99 = "met" if _p(lat, 99) <= TARGET_P99_MS else "missed"
            print(f"\npick-up from the enqueue's return ({side}, {lat['samples']} samples): "
                  f"p50 {_p(lat, 50):.2f} ms ({ok50}, ÷ target {_p(lat, 50) / TARGET_P50_MS:.2f}), "
                  f"p99 {_p(lat, 99):.2f} ms ({ok99}, ÷ target {_p(lat, 99) / TARGET_P99_MS:.2f}); "
                  f"from the call: p50 {lat['p50_ms']:.2f} ms; enqueue call → claim "
                  f"{lat['to_claim_p50_ms']:.2f} ms, claim → handler "
                  f"{lat['claim_to_start_p50_ms']:.2f} ms")
    for side, idle in res["idle"].items():
        print(f"\nidle ({side}, {idle['seconds']:g} s): supervisor {idle['supervisor_cpu_s']:.3f} "
              f"CPU s, fork server and spares ({idle['processes'] - 1}) "
              f"{idle['helpers_cpu_s']:.3f} CPU s: {idle['share_of_a_core']:.2%} of a core; "
              f"Redis {idle['redis_cpu_s']:.3f} CPU s, {idle['redis_commands_per_s']:.1f} "
              f"commands/s")


def _p(lat: dict[str, Any], p: int) -> float:
    from bench.common import percentile

    return percentile(lat["after_all_ms"], p) or 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--samples", type=int, default=100, help="pick-up samples (0: none)")
    p.add_argument("--idle", type=float, default=30.0, help="idle seconds (0: none)")
    p.add_argument("--baseline", help="another checkout's venv python: the baseline")
    p.add_argument("--base-commit", help="the scripts alone: a baseline's claim and ack "
                   "from this git commit (e.g. main)")
    p.add_argument("--drains", type=int, default=None,
                   help="drain rounds (default: --rounds; 0: the scripts alone only)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    with RedisServer() as server:
        res = run(server.url(), args)
    report(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
