"""What keeping each job's cost costs (issue 30 item 1), with and without it in one run.

    .venv/bin/python -m bench.metering                  # 2,000 jobs a figure, 5 rounds
    .venv/bin/python -m bench.metering --jobs 500 --rounds 3 --e2e 0

Two parts, each on one private Redis, the variants alternating which goes first:

* **Scripts**: the end transitions that carry the cost — ack (one job a call, and 16 a
  call as a busy supervisor batches them), fail, expire — as they were before the
  metering (read from git: the parent of the commit that added lua/includes/cost.lua,
  which also predates the circuit breaker's count, one command: compare off with on),
  as they are with an empty cost (`[supervisor].job_cost = false`), and with a cost (the
  record's field and the hourly per-group totals; ten groups). Redis's µs per job (INFO
  commandstats: EVALSHA's usec, the commands inside included) and the commands Redis
  runs per job (those inside the script: with a cost, the totals' HMGET and HSET a call,
  and fail's and expire's HSET of the record; ack writes it in the HSET that ends the job).
* **End to end**: a real supervisor drains `--e2e` no-op jobs with ``job_cost = true``
  and ``false`` (the same checkout), in `--e2e-pairs` pairs run back to back (ABBA…:
  the order flips each pair), so a neighbour's load hits both of a pair alike: jobs/s,
  the supervisor's CPU ms per job, Redis's CPU ms and commands per job. The "plain
  path" of the issue: within 5% means the median of the pairs' metered ÷ plain jobs/s
  at least 0.95 (the pairs' own ratios printed: one pair on a loaded machine spreads
  ±15%); Redis's commands and CPU per job say the same with far less noise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, RedisServer, command_calls, log, median  # noqa: E402
from bench.luaprologue import reader_at  # noqa: E402
from forq import Queue  # noqa: E402
from forq.store import transitions as tr  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.store.scripts import expand, source  # noqa: E402

OWNER = "bench-metering:1"
LEASE_MS = 600_000
PIPELINE = 100
GROUPS = 10
COST = "312,4,104857600,350,3"  # 0.3 s of CPU, 100 MiB, as a real report says it
SCRIPTS = ("ack", "fail", "expire")
ROWS = ("ack, 1 a call", "ack, 16 a call", "fail (dead)", "expire")
VARIANTS = ("before", "off", "on")
METERED = ("hset", "hmget", "hincrby", "expireat")  # what record_cost and add_usage run


def before_metering() -> str | None:
    """The parent of the commit that added lua/includes/cost.lua, or None."""
    found = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                            "lua/includes/cost.lua"], cwd=REPO, capture_output=True, text=True)
    commits = found.stdout.split()
    return f"{commits[-1]}^" if not found.returncode and commits else None


def _jobs(client: Any, n: int) -> tuple[Queue, list[tuple[str, str]]]:
    """A fresh queue with `n` grouped jobs, all claimed: their (id, token)."""
    q = Queue("bm" + uuid.uuid4().hex[:8], redis=client)
    for start in range(0, n, 5000):
        q.enqueue_many([{"task": "bench.noop", "group": f"g{i % GROUPS}"}
                        for i in range(start, min(n, start + 5000))])
    q.set_limits(group_concurrency=n)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < n:
        claimed = tr.parse_claim(q.scripts.run(tr.claim_call(q.keys, OWNER, 100, LEASE_MS)), q)
        if not claimed.leases:
            raise RuntimeError(f"claimed {len(pairs)} of {n}")
        pairs += [(lease.job.id, lease.token) for lease in claimed.leases]
    return q, pairs


def _args(row: str, variant: str, q: Queue, batch: list[tuple[str, str]]) -> tuple[Any, ...]:
    """The (keys, args) of one call of `row` for `batch`, as `variant`'s script takes them."""
    cost = [] if variant == "before" else [COST if variant == "on" else ""]
    k = q.keys
    if row.startswith("ack"):
        args: list[Any] = [k.prefix, k.queue]
        for job_id, token in batch:
            args += [job_id, token, "null", *cost, 0]
        return (k.active, k.pending, k.scheduled), tuple(args)
    job_id, token = batch[0]
    # fail's and expire's cost follows the circuit breaker's pattern ("": none), which
    # the scripts from before take no more than the cost
    if row.startswith("fail"):
        return ((k.active, k.scheduled, k.dead),
                (k.prefix, job_id, token, json.dumps({"reason": "bench"}), "fatal", 0.5, 0, "0",
                 "", *cost))
    return (k.active,), (k.prefix, job_id, token, "bench", "", *cost)


def measure(client: Any, row: str, variant: str, text: str,
            n: int) -> tuple[float, float, float]:
    """Redis µs per job, commands per job (inside the script), and µs per job of the
    commands named as the metering's (`METERED`), of `row` in `variant`."""
    per_call = 16 if row == "ack, 16 a call" else 1
    q, pairs = _jobs(client, n)
    sha = client.script_load(text)
    client.config_resetstat()
    for start in range(0, n, PIPELINE * per_call):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(n, start + PIPELINE * per_call), per_call):
            keys, args = _args(row, variant, q, pairs[i:i + per_call])
            pipe.evalsha(sha, len(keys), *keys, *args)
        for reply in pipe.execute():
            answers = reply if isinstance(reply, list) and row.startswith("ack") else [reply]
            assert all(a == "ok" or a[0] == "dead" for a in answers), reply
    stats = client.info("commandstats")
    evalsha = stats["cmdstat_evalsha"]
    inside = sum(calls for name, calls in command_calls(client).items()
                 if name not in ("evalsha", "config", "info"))
    # the commands the metering adds, with the ones of the same name the script ran anyway
    metered = sum(float(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in METERED)
    client.flushdb()
    return float(evalsha["usec"]) / n, inside / n, metered / n


def scripts_part(n: int, rounds: int) -> dict[str, Any]:
    commit = before_metering()
    if commit is None:
        raise SystemExit("needs the git history (the commit that added lua/includes/cost.lua)")
    old = reader_at(commit)
    texts = {"before": {name: expand(name, old) for name in SCRIPTS},
             "off": {name: source(name) for name in SCRIPTS}}
    texts["on"] = texts["off"]
    runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    with RedisServer() as server:
        client = connect(server.url(0))
        for round_ in range(rounds):
            log(f"metering: scripts, round {round_ + 1}/{rounds}")
            for i, row in enumerate(ROWS):  # the variants of a row back to back
                order = VARIANTS if (round_ + i) % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    script = row.split(" ")[0].rstrip(",")
                    runs.setdefault((row, variant), []).append(
                        measure(client, row, variant, texts[variant][script], n))
        version = server.version()
    # per row and variant: Redis µs/job (median, and least of the rounds: the one the
    # machine's other load disturbed least), commands/job, the metering commands' µs/job
    table = {row: {variant: [median(f[0] for f in runs[(row, variant)]),
                             min(f[0] for f in runs[(row, variant)]),
                             median(f[1] for f in runs[(row, variant)]),
                             median(f[2] for f in runs[(row, variant)])]
                   for variant in VARIANTS} for row in ROWS}
    return {"redis": version, "before": commit, "jobs": n, "rounds": rounds, "rows": table}


def supervisor_part(n: int) -> float:
    """µs per job of what the supervisor does more for a metered job: its child's cost
    for the report (`cost_of`) and for the histograms (`measure`, three observations)."""
    from prometheus_client import CollectorRegistry

    from forq.supervisor.children.cost import cost_of, measure
    from forq.supervisor.observe.metrics_cost import CostMetrics

    child: Any = SimpleNamespace(pid=1234, started=100.0, ended=100.35, claimed=99.998,
                                 reader=SimpleNamespace(began=100.004),
                                 cpu_us=(312_000, 4_000), peak_rss=100 << 20)
    metrics = CostMetrics(CollectorRegistry())
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            cost_of(child)
            cost = measure(child)
            assert cost is not None and cost.start_latency_ms is not None
            metrics.observe("q", "t", cost.cpu_seconds, cost.peak_bytes,
                            cost.start_latency_ms / 1000)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def e2e_part(n: int, rounds: int) -> dict[str, Any]:
    from bench.supervisor import drain_once

    runs: dict[str, list[dict[str, Any]]] = {"true": [], "false": []}
    with RedisServer() as server:
        for round_ in range(rounds):
            for setting in (("true", "false") if round_ % 2 == 0 else ("false", "true")):
                log(f"metering: end to end, pair {round_ + 1}/{rounds}, job_cost = {setting}")
                runs[setting].append(drain_once(server.url(0), n,
                                                supervisor_extra=f"job_cost = {setting}"))
    for r in runs["true"] + runs["false"]:
        # all the CPU a job took: the supervisor, the fork server and the job's child,
        # Redis; on a machine whose cores are busy this, not jobs/s, is what load spares
        r["cpu_ms_per_job"] = (r["parent_cpu_ms_per_job"] + r["children_cpu_ms_per_job"]
                               + r["redis_cpu_ms_per_job"])
    fields = ("jobs_per_s", "parent_cpu_ms_per_job", "redis_cpu_ms_per_job",
              "children_cpu_ms_per_job", "cpu_ms_per_job")
    out: dict[str, Any] = {"jobs": n, "rounds": rounds}
    # each pair's metered ÷ plain: the two drains of a pair ran back to back
    for name, field in (("pair_ratios", "jobs_per_s"),
                        ("pair_redis_cpu_ratios", "redis_cpu_ms_per_job"),
                        ("pair_parent_cpu_ratios", "parent_cpu_ms_per_job"),
                        ("pair_cpu_ratios", "cpu_ms_per_job")):
        out[name] = [round(on[field] / off[field], 3) if off[field] else None
                     for on, off in zip(runs["true"], runs["false"], strict=True)]
    for setting, got in runs.items():
        out[setting] = {f: median(r[f] for r in got) for f in fields}
        out[setting]["redis_commands_per_job"] = median(
            r["redis_commands_per_job"]["total"] for r in got)
        out[setting]["jobs_per_s_range"] = [min(r["jobs_per_s"] for r in got),
                                            max(r["jobs_per_s"] for r in got)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2_000, help="jobs per script figure")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (median taken)")
    parser.add_argument("--e2e", type=int, default=2_000,
                        help="no-op jobs per end-to-end drain (0: skip that part)")
    parser.add_argument("--e2e-pairs", "--e2e-rounds", dest="e2e_rounds", type=int, default=8,
                        help="end-to-end pairs (on, off back to back; median of their ratios)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"scripts": scripts_part(args.jobs, args.rounds)}
    s = result["scripts"]
    print(f"\nRedis {s['redis']}; {s['jobs']:,} jobs a figure, median of {s['rounds']} rounds; "
          f"before = {s['before']}\n")
    print("Redis µs/job: median of the rounds (least in brackets); metering µs/job: what "
          "HSET, HMGET, HINCRBY and EXPIREAT took more with a cost than without (INFO "
          "commandstats)\n")
    print("| transition | Redis µs/job before | off | on | commands/job before | off | on "
          "| metering µs/job |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row, by in s["rows"].items():
        b, f, o = by["before"], by["off"], by["on"]
        print(f"| {row} | {b[0]:.1f} ({b[1]:.1f}) | {f[0]:.1f} ({f[1]:.1f}) | "
              f"{o[0]:.1f} ({o[1]:.1f}) | {b[2]:.1f} | {f[2]:.1f} | {o[2]:.1f} | "
              f"{o[3] - f[3]:.2f} |")
    per_job = result["supervisor_usec"] = supervisor_part(20_000)
    print(f"\nsupervisor: {per_job:.1f} µs of its CPU per metered job (the cost for the "
          "report and the three histograms; least of 5 × 20,000)")
    if args.e2e:
        e = result["e2e"] = e2e_part(args.e2e, args.e2e_rounds)
        on, off = e["true"], e["false"]
        print(f"\nend to end: {e['jobs']:,} no-op jobs drained, concurrency 2, median of "
              f"{e['rounds']} pairs (on and off back to back, the order flipped each pair)\n")
        print("| job_cost | jobs/s | supervisor CPU ms/job | fork server + child CPU ms/job | "
              "Redis CPU ms/job | all CPU ms/job | Redis commands/job |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, r in (("false", off), ("true", on)):
            print(f"| {name} | {r['jobs_per_s']:.0f} | {r['parent_cpu_ms_per_job']:.3f} | "
                  f"{r['children_cpu_ms_per_job']:.3f} | {r['redis_cpu_ms_per_job']:.3f} | "
                  f"{r['cpu_ms_per_job']:.3f} | {r['redis_commands_per_job']:.1f} |")
        pairs = e["pair_ratios"]
        ratio = e["median_pair_ratio"] = median(pairs)
        # the middle half of the pairs' ratios: how far one pair is from the median
        quart = sorted(pairs)[len(pairs) // 4:len(pairs) - len(pairs) // 4] or pairs
        verdict = "within 5%" if ratio >= 0.95 else "NOT within 5%"
        if e["rounds"] < 3:
            verdict = "fewer than 3 pairs: no verdict from jobs/s"
        print(f"\nmetered ÷ plain jobs/s, each pair: {pairs}")
        print(f"median of the pairs: {ratio:.3f} ({verdict}; the middle half of the pairs "
              f"{quart[0]:.3f}–{quart[-1]:.3f})")
        cpu = e["median_pair_cpu_ratio"] = median(r for r in e["pair_cpu_ratios"] if r)
        print(f"metered ÷ plain CPU per job (supervisor, fork server, child, Redis), each "
              f"pair: {e['pair_cpu_ratios']}; median {cpu:.3f} "
              f"({'within' if cpu <= 1.05 else 'NOT within'} 5%)")
        print(f"metered ÷ plain, medians of the pairs: Redis CPU per job "
              f"{median(r for r in e['pair_redis_cpu_ratios'] if r):.3f}, supervisor CPU "
              f"per job {median(r for r in e['pair_parent_cpu_ratios'] if r):.3f}; Redis "
              f"commands per job {on['redis_commands_per_job']:.1f} on, "
              f"{off['redis_commands_per_job']:.1f} off")
        # what the metering adds per job, against the whole of the plain job's CPU in
        # the supervisor and Redis (the fork and the child's own work not counted)
        redis_more = s["rows"]["ack, 16 a call"]["on"][3] - s["rows"]["ack, 16 a call"]["off"][3]
        plain = (off["parent_cpu_ms_per_job"] + off["redis_cpu_ms_per_job"]) * 1000
        share = (per_job + redis_more) / plain
        e["metering_share"] = share
        print(f"metering per job: {per_job:.1f} µs supervisor + {redis_more:.1f} µs Redis = "
              f"{100 * share:.1f}% of the plain job's {plain:.0f} µs of supervisor and Redis "
              f"CPU ({'within' if share <= 0.05 else 'NOT within'} 5%)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
