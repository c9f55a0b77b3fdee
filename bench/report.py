"""Turn one run's results (bench/results.json) into bench/RESULTS.md."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

# written by hand, appended to every rendering from its first "## " heading on
FINDINGS_PATH = Path(__file__).resolve().parent / "FINDINGS.md"

NAMES = {"forq": "forq (supervisor, concurrency 2, `prefetch = 0`)",
         "forq-prefetch": "forq, `prefetch = {prefetch}` (docs/operations/supervisor.md, \"Prefetch\")",
         "forq-events-off": "forq, the queue's `events = false` (docs/guide/events.md)",
         "forq-chunked": "forq, a chunked no-op, `task(chunk={chunk})` (docs/guide/chunks.md)",
         "rq-fork": "RQ Worker ×2 (fork per job)",
         "rq-simple": "RQ SimpleWorker ×2 (no fork)", "celery": "Celery prefork, concurrency 2",
         "dramatiq": "Dramatiq 2 processes × 1 thread"}


def n(x: Any, digits: int = 0) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, (int, float)):
        return f"{x:,.{digits}f}"
    return str(x)


def mib(x: Any) -> str:
    return "n/a" if not x else f"{x / 2**20:.1f} MiB"


def table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def runs(d: dict[str, Any] | None, digits: int = 0) -> str:
    if not d or not d.get("runs"):
        return ""
    return ", ".join(n(x, digits) for x in d["runs"])


def get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def addbulk_table(e: dict[str, Any]) -> list[str]:
    """forq's enqueue_many beside BullMQ's addBulk (bench/addbulk.py), by payload."""
    bulk = e.get("addbulk") or {}
    rows: list[list[Any]] = []
    for payload, label in (("noop", "no-op, no arguments"),
                           ("mail", "a mail job's arguments (≈ 170 bytes of JSON)")):
        d = bulk.get(payload) or {}
        if not d.get("forq"):
            continue
        f, b, r = d["forq"], d.get("bullmq") or {}, d.get("ratio") or {}
        rows.append([label, n(f.get("n")), n(f["median"]), cpu_split(f), n(b.get("median")),
                     cpu_split(b), f"**{r['median']:.2f}×**" if r.get("median") else "",
                     "; ".join(f"{n(x)} vs {n(y)}" for x, y in
                               zip(d["forq"]["runs"], b.get("runs") or [], strict=False))
                     or runs(d["forq"])])
    if not rows:
        return []
    version = e.get("bullmq_version") or ""
    return ["### forq `enqueue_many` against BullMQ " + version + " `addBulk` (#27)\n",
            "Each round measures both, one after the other, on the same Redis: forq's "
            "`enqueue_many` of the whole list (validated, 500 jobs a script call, one "
            "pipeline), BullMQ's `addBulk` 1,000 jobs a call, timed in Node from the first "
            "call to the last's return; both build their job list before the clock. The "
            "ratio is the median of the rounds' own ratios (bench/addbulk.py). CPU per job: "
            "the producer process's own and Redis's (INFO cpu) over the timed calls, median "
            "of the rounds.\n",
            table(["jobs", "n", "forq enqueue_many, jobs/s", "CPU µs per job: Python / Redis",
                   "BullMQ addBulk, jobs/s", "CPU µs per job: Node / Redis", "forq ÷ BullMQ",
                   "runs (forq vs BullMQ)"], rows), ""]


def cpu_split(d: dict[str, Any]) -> str:
    if d.get("client_cpu_us_per_job") is None:
        return ""
    return f"{d['client_cpu_us_per_job']:.1f} / {d['redis_cpu_us_per_job']:.1f}"


# -- the targets ------------------------------------------------------------------------------


def targets(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    s = res.get("sections", {})
    out: list[tuple[str, str, str, bool | None]] = []
    fork = res.get("fork_limit")
    forq_e2e = get(s, "e2e", "forq", "median")
    rq_fork = get(s, "e2e", "rq-fork", "median")
    if forq_e2e and rq_fork:
        ratio = forq_e2e / rq_fork
        out.append(("end to end ≥ 3× RQ's forking Worker (2 processes)", "≥ 3.0×",
                    f"{ratio:.1f}× ({n(forq_e2e)} vs {n(rq_fork)} jobs/s)", ratio >= 3))
    if forq_e2e and fork:
        share = forq_e2e / fork
        out.append(("end to end ≥ 50% of the raw fork limit", "≥ 50%",
                    f"{share:.0%} ({n(forq_e2e)} of {n(fork)} forks/s)", share >= 0.5))
    # issue 18 reads them with the prefetch a user of short jobs sets, when it was measured
    prefetched = get(s, "e2e", "forq-prefetch") or {}
    free = prefetched.get("median") or forq_e2e
    how = f" with prefetch {prefetched.get('prefetch')}" if prefetched.get("median") else ""
    if free and fork:
        share = free / fork
        out.append((f"isolation for free: end to end{how} ≥ 80% of the fork limit (#18)",
                    "≥ 80%", f"{share:.0%} ({n(free)} of {n(fork)} forks/s)", share >= 0.8))
    dramatiq = get(s, "e2e", "dramatiq", "median")
    if free and dramatiq:
        ratio = free / dramatiq
        out.append((f"isolation for free: end to end{how} ≥ Dramatiq 2 × 1 (#18)", "≥ 1.0×",
                    f"{ratio:.2f}× ({n(free)} vs {n(dramatiq)} jobs/s)", ratio >= 1.0))
    chunked = get(s, "e2e", "forq-chunked", "median")
    if chunked and dramatiq:
        ratio = chunked / dramatiq
        out.append(("chunked no-op handlers ≥ 3× Dramatiq 2 × 1 (#27)", "≥ 3.0×",
                    f"{ratio:.2f}× ({n(chunked)} vs {n(dramatiq)} jobs/s)", ratio >= 3.0))
    many = get(s, "enqueue", "forq", "enqueue_many", "median")
    if many:
        out.append(("enqueue_many ≥ 40,000 jobs/s", "≥ 40,000/s", f"{n(many)}/s", many >= 40_000))
    bulk = get(s, "enqueue", "addbulk", "noop") or {}
    if bulk.get("ratio"):
        ratio = bulk["ratio"]["median"]
        mail = get(s, "enqueue", "addbulk", "mail", "ratio", "median")
        out.append(("enqueue_many ≥ 2.5× BullMQ's addBulk, same run (#27)", "≥ 2.5×",
                    f"{ratio:.2f}× ({n(bulk['forq']['median'])} vs {n(bulk['bullmq']['median'])}"
                    f" jobs/s){f'; mail jobs {mail:.2f}×' if mail else ''}", ratio >= 2.5))
    single = get(s, "enqueue", "forq", "enqueue", "median")
    rq_single = get(s, "enqueue", "rq", "enqueue", "median")
    if single and rq_single:
        ratio = single / rq_single
        out.append(("single enqueue within 20% of RQ's", "≥ 0.8× RQ",
                    f"{ratio:.2f}× ({n(single)} vs {n(rq_single)}/s)", ratio >= 0.8))
    p50 = get(s, "latency", "forq", "p50_ms")
    if p50 is not None:
        out.append(("pick-up latency p50 (idle)", "≤ 5 ms",
                    f"{p50:.2f} ms (p99 {get(s, 'latency', 'forq', 'p99_ms'):.2f} ms)", p50 <= 5))
    after50 = get(s, "latency", "forq", "after_p50_ms")
    if after50 is not None:
        after99 = get(s, "latency", "forq", "after_p99_ms")
        out.append(("pick-up latency from enqueue's return (idle, #18)", "p50 ≤ 2 ms, p99 ≤ 6 ms",
                    f"p50 {after50:.2f} ms, p99 {after99:.2f} ms",
                    after50 <= 2 and after99 <= 6))
    crash = get(s, "recovery", "forq", "child")
    if crash:
        pend = get(crash, "pending_again_s", "median")
        again = get(crash, "running_again_s", "median")
        if pend is not None:
            out.append(("child crash → job pending again", "≤ 1 s",
                        f"{pend:.3f} s (running again {n(again, 3)} s)", pend <= 1.0))
    sup = get(s, "recovery", "forq", "worker")
    if sup and get(sup, "running_again_s", "median") is not None:
        bound = sup["lease_ttl_s"] + sup["reaper_interval_s"]
        v = sup["running_again_s"]["median"]
        out.append(("supervisor SIGKILL → job running again", f"≤ lease_ttl + reaper = {bound:g} s",
                    f"{v:.2f} s", v <= bound))
    scale = s.get("scale") or {}
    small, big = scale.get("1000"), scale.get("1000000") or scale.get("100000")
    if small and big:
        label = "1M" if "1000000" in scale else "100k (1M skipped)"
        r100 = big["claim_ack_100"] / small["claim_ack_100"]
        r1 = big["claim_ack_1"] / small["claim_ack_1"]
        out.append((f"claim+ack at {label} backlog ≥ 80% of 1k", "≥ 0.80",
                    f"{r100:.2f} (claim 100) / {r1:.2f} (claim 1)", min(r100, r1) >= 0.8))
    ceil = s.get("ceiling") or {}
    forq_c, bull_c = ceil.get("forq"), ceil.get("bullmq")
    if forq_c:
        cmds = forq_c["commands_per_job"]["median"]
        out.append(("Redis commands per job (claim, extend, ack; 8 × 50 slots)", "≤ 15",
                    f"{cmds:.1f}", cmds <= 15))
        us = forq_c["redis_cpu_us_per_job"]["median"]
        peer = (f"; BullMQ {bull_c['redis_cpu_us_per_job']['median']:.1f} µs in this run"
                if bull_c else "")
        out.append(("Redis CPU per job (8 × 50 slots)", "≤ 29 µs (BullMQ's in #18)",
                    f"{us:.1f} µs{peer}", us <= 29))
    if forq_c and bull_c:
        ratio = ceil["forq_vs_bullmq"]
        out.append(("Redis ceiling ≥ BullMQ's (jobs per Redis CPU second)", "≥ 1.0×",
                    f"{ratio:.2f}× ({n(forq_c['redis_ceiling_jobs_per_s']['median'])} vs "
                    f"{n(bull_c['redis_ceiling_jobs_per_s']['median'])} jobs/s)", ratio >= 1))
    if s.get("appsize"):
        from bench import appsize

        out += appsize.targets(s["appsize"])
    held = s.get("leases")
    if held:
        jobs = held["jobs"]
        cpu = held["supervisor_cpu_share"]
        out.append((f"{jobs:,} leases held: supervisor CPU", "< 5% of a core",
                    f"{cpu:.1%} (ttl {held['lease_ttl_s']:g} s, memory sampled every "
                    f"{held['memory_sample_interval_s'] * 1000:g} ms)", cpu < 0.05))
        slack = held["lease_slack_min"]
        out.append((f"{jobs:,} leases extended within ttl/3", "earliest lease ≥ 2/3 ttl left "
                    "(≥ 1/3 at worst)", f"{slack:.0%} of the ttl; {held['reclaimed']} ran out",
                    slack is not None and slack >= 1 / 3 and held["reclaimed"] == 0))
        out.append((f"supervisor RSS at {jobs:,} running children", "≤ 60 MiB",
                    f"{mib(held['supervisor_rss'])} (fork server {mib(held['fork_server_rss'])})",
                    held["supervisor_rss"] <= 60 * 2**20))
    return out


def summary_table(res: dict[str, Any]) -> str:
    rows = targets(res)
    lines = [f"{'target':<52} {'goal':<28} {'measured':<42} result"]
    for name, goal, got, ok in rows:
        verdict = "met" if ok else ("MISSED" if ok is False else "?")
        lines.append(f"{name:<52} {goal:<28} {got:<42} {verdict}")
    if res.get("errors"):
        lines.append(f"sections that failed: {', '.join(res['errors'])}")
    return "\n".join(lines)


# -- the profile ----------------------------------------------------------------------------------


def summarize_py_spy(raw: str, top: int = 25) -> dict[str, Any]:
    """py-spy's raw (collapsed) stacks → inclusive and self shares per function."""
    total = 0
    incl: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        try:
            k = int(count)
        except ValueError:
            continue
        total += k
        frames = stack.split(";")
        names = []
        for f in frames:
            name, _, where = f.partition(" (")
            names.append(f"{name} ({where.split(':')[0]})" if where else name)
        leaf[names[-1]] += k
        for name in set(names):
            incl[name] += k
    skip = ("<module>", "_run_module_as_main", "_run_code", "main (", "cmd_run", "run_supervisor")
    inclusive = [(c / total, f) for f, c in incl.most_common(top + 10)
                 if not f.startswith(skip)][:top]
    return {"samples": total, "inclusive": inclusive,
            "self": [(c / total, f) for f, c in leaf.most_common(15)]}


# -- the document ------------------------------------------------------------------------------------


def render(res: dict[str, Any], source: str = "bench/results.json",
           with_findings: bool = True) -> str:
    """The Markdown of one run; `source` names the JSON it was rendered from. Another
    host's run, kept beside the main one (bench/RESULTS-amd-epyc.md), leaves the findings
    to RESULTS.md."""
    s = res.get("sections", {})
    m = res.get("machine", {})
    v = res.get("versions", {})
    peers = v.get("peers", {})
    out: list[str] = []
    out.append("# forq benchmark results\n")
    ran = list(s)
    only = "" if len(ran) >= 9 else f" --only {','.join(ran)}"  # a partial run says so
    out.append(f"`python -m bench{' --quick' if res.get('mode') == 'quick' else ''}{only}`, "
               f"{res.get('date')}, {res.get('seconds', 0):.0f} s. One private redis-server "
               "(no persistence) on a free port; every figure is the median of several runs "
               f"(the runs are listed). Generated by bench/report.py from {source}; "
               "do not edit by hand.\n")
    out.append(f"- **machine:** {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB, "
               f"Linux {m.get('kernel')}, Python {m.get('python')}"
               + (f", transparent huge pages: {m['thp']}" if m.get("thp") else ""))
    out.append(f"- **versions:** forq {v.get('forq')}, Redis {v.get('redis_server')}, redis-py "
               f"{v.get('redis_py_forq')}; RQ {peers.get('rq')}, Celery {peers.get('celery')} "
               f"(kombu {peers.get('kombu')}, billiard {peers.get('billiard')}), Dramatiq "
               f"{peers.get('dramatiq')}, peers' redis-py {peers.get('redis')}"
               + (f"; the real application: Django {peers['django']}, pandas "
                  f"{peers.get('pandas')}, numpy {peers.get('numpy')}" if peers.get("django")
                  else ""))
    loads = res.get("load", {})
    if loads:
        worst = max(max(x["start"], x["end"]) for x in loads.values())
        out.append(f"- **load average** (1 min) during the run: up to {worst:.1f} on "
                   f"{m.get('cores')} cores, this benchmark's own processes included"
                   + (" — other work shared the machine, so absolute figures are noisy; "
                      "compare within the run" if worst > (m.get("cores") or 2) * 1.25
                      else ""))
    out.append("")
    if res.get("errors"):
        out.append("**Sections that failed:** " + ", ".join(res["errors"]) + " (tracebacks in "
                   "results.json)\n")

    out.append("## Targets\n")
    rows = [[name, goal, got, "met" if ok else "**missed**"] for name, goal, got, ok in targets(res)]
    out.append(table(["target", "goal", "measured", "result"], rows))
    out.append("")

    fork = res.get("fork_limit")
    if "limits" in s:
        lim = s["limits"]
        out.append("## Limits of this machine\n")
        rows = []
        f = lim.get("fork", {})
        rows.append([f"fork()+_exit+waitpid, serial, in a {mib(f.get('rss'))} process "
                     "(a supervisor's imports, frozen heap, padded to its idle RSS)",
                     f"{n(f.get('forks_per_s'))} /s", runs(f)])
        again = get(s, "e2e", "fork_limit_in_rounds")
        if again and again.get("runs"):
            rows.append(["the same, measured again in each end-to-end round",
                         f"{n(again['median'])} /s", runs(again)])
        if res.get("fork_limit_runs"):
            rows.append(["**fork limit used for the ratios** (median of all the above)",
                         f"**{n(fork)} /s**", ""])
        for name, d in lim.get("redis_benchmark", {}).items():
            rows.append([f"redis-benchmark {name}", f"{n(d.get('median'))} /s", runs(d)])
        out.append(table(["what", "rate", "runs"], rows))
        out.append("")

    if "enqueue" in s:
        e = s["enqueue"]
        out.append("## Enqueue (no-op jobs, one producer)\n")
        rows = []
        for system, label in (("forq", "forq"), ("rq", "RQ"), ("celery", "Celery"),
                              ("dramatiq", "Dramatiq")):
            for method, d in (e.get(system) or {}).items():
                if isinstance(d, dict) and "median" in d:
                    rows.append([f"{label} `{method}`", n(d.get("n")), f"{n(d['median'])}",
                                 runs(d)])
        out.append(table(["producer call", "jobs", "jobs/s", "runs"], rows))
        out.append("\nforq `enqueue_many` and RQ `enqueue_many` get the whole list in one call; "
                   "Celery `delay` and Dramatiq `send` have no batch form.\n")
        out += addbulk_table(e)

    if "e2e" in s:
        e = s["e2e"]
        out.append("## End to end: no-op jobs drained by 2 worker processes\n")
        out.append("The jobs are enqueued first, then the workers started; the rate is taken "
                   "from the first finished job to the last (start-up not counted), from each "
                   "system's own completion record (forq's `succeeded` counter, RQ's finished "
                   "registry, Celery's and Dramatiq's result keys).\n")
        rows = []
        forq_rate = get(e, "forq", "median")
        for system in ("forq", "forq-prefetch", "forq-events-off", "forq-chunked", "rq-fork",
                       "rq-simple", "celery", "dramatiq"):
            d = e.get(system)
            if not isinstance(d, dict) or "median" not in d:
                continue
            fork_per_job = "yes" if system.startswith("forq") or system == "rq-fork" else "no"
            if system == "forq-chunked":
                fork_per_job = f"per chunk of ≤ {d.get('chunk')}"
            rows.append([NAMES[system].format(prefetch=d.get("prefetch"), chunk=d.get("chunk")),
                         fork_per_job,
                         n(d.get("n")), n(d["median"]),
                         f"{d['median'] / fork:.0%}" if fork else "n/a",
                         f"{forq_rate / d['median']:.2f}×"
                         if forq_rate and not system.startswith("forq") else "", runs(d)])
        out.append(table(["system", "fork per job", "jobs", "jobs/s", "of fork limit",
                          "forq ÷ this", "runs"], rows))
        f = e.get("forq") or {}
        if f:
            lim = get(s, "limits", "fork") or {}
            out.append("\nCost per job, forq against a bare fork of a process of the same size "
                       "(from the limits section):\n")
            rows = [["forq: the supervisor (parent)",
                     f"{n(f.get('parent_cpu_ms_per_job'), 2)} ms "
                     f"({n(f.get('parent_user_ms_per_job'), 2)} user + "
                     f"{n(f.get('parent_sys_ms_per_job'), 2)} system)",
                     n(f.get("parent_minor_faults_per_job"))],
                    ["forq: the job's child", f"{n(f.get('children_cpu_ms_per_job'), 2)} ms", ""],
                    ["forq: Redis", f"{n(f.get('redis_cpu_ms_per_job'), 2)} ms", ""]]
            if lim.get("parent_cpu_ms_per_fork") is not None:
                rows += [["bare fork+_exit+waitpid: parent",
                          f"{n(lim['parent_cpu_ms_per_fork'], 2)} ms",
                          n(lim.get("parent_minor_faults_per_fork"))],
                         ["bare fork+_exit+waitpid: child",
                          f"{n(lim['child_cpu_ms_per_fork'], 2)} ms",
                          n(lim.get("child_minor_faults_per_fork"))]]
            out.append(table(["", "CPU per job", "minor page faults per job"], rows))
            out.append(f"\nSupervisor RSS {mib(f.get('supervisor_rss'))} after a drain of "
                       f"{n(f.get('n'))} jobs (idle at start: "
                       f"{mib(get(s, 'limits', 'supervisor_rss_idle'))}).\n")
            rows = []
            for system in ("forq", "rq-fork", "rq-simple", "celery", "dramatiq"):
                c = get(e, system, "redis_commands_per_job")
                if c:
                    top = ", ".join(f"{k} {v:g}" for k, v in list(c["top"].items())[:8])
                    rows.append([NAMES[system], n(c["total"], 1), top])
            if rows:
                out.append("Redis commands per job (counted by Redis, including those run "
                           "inside Lua scripts; the benchmark's own polling left out):\n")
                out.append(table(["system", "commands per job", "most frequent"], rows))
                out.append("")
        prof = e.get("profile")
        if prof:
            out.append(f"### Where the supervisor's time goes (py-spy, {prof['samples']} samples, "
                       "one extra drain)\n")
            rows = [[f"{share:.1%}", f"`{name}`"] for share, name in prof["inclusive"]]
            out.append(table(["inclusive", "function"], rows))
            out.append("")
            rows = [[f"{share:.1%}", f"`{name}`"] for share, name in prof["self"][:10]]
            out.append(table(["self", "function"], rows))
            out.append("")

    if "latency" in s:
        lat = s["latency"]
        out.append("## Pick-up latency on an idle system (enqueue → handler starts)\n")
        out.append("One job at a time; the handler returns `time.time()` at its start, compared "
                   "with `time.time()` just before the enqueue call, and just after it returned "
                   "(one clock, µs resolution).\n")
        rows = []
        for system in ("forq", "rq-fork", "rq-simple", "celery", "dramatiq"):
            d = lat.get(system)
            if isinstance(d, dict) and "p50_ms" in d:
                rows.append([NAMES[system], n(d.get("samples")), n(d["p50_ms"], 2),
                             n(d["p99_ms"], 2), n(d.get("max_ms"), 2),
                             n(d.get("after_p50_ms"), 2), n(d.get("after_p99_ms"), 2)])
        out.append(table(["system", "samples", "p50 ms", "p99 ms", "max ms",
                          "from the return: p50 ms", "p99 ms"], rows))
        f = lat.get("forq") or {}
        if "to_claim_p50_ms" in f:
            out.append(f"\nforq's split at the claim (the claim script's Redis time, ms "
                       f"resolution): enqueue call → claim {n(f['to_claim_p50_ms'], 2)} ms, claim → "
                       f"handler running {n(f['claim_to_start_p50_ms'], 2)} ms (the reply, the "
                       "fork and the child's set-up), at p50.\n")

    if "recovery" in s:
        rec = s["recovery"]
        out.append("## Recovery after SIGKILL (a 20 s job)\n")
        out.append("*child*: SIGKILL of the process running the job (forq's child, RQ's work "
                   "horse, Celery's pool process, a Dramatiq worker process). *worker*: SIGKILL "
                   "of the whole worker with its children, and a fresh one started at once (as "
                   "systemd would). Seconds from the kill until the job's handler starts again; "
                   "\"never\" when it did not within the cap. Peers are configured for "
                   "at-least-once as their docs advise: RQ `Retry(max=3)`, Celery "
                   "`acks_late` + `reject_on_worker_lost`, Dramatiq defaults.\n")
        rows = []
        fr = rec.get("forq") or {}
        if fr.get("child"):
            c = fr["child"]
            rows.append(["forq", "child",
                         f"{n(get(c, 'running_again_s', 'median'), 3)} s "
                         f"(pending again {n(get(c, 'pending_again_s', 'median'), 3)} s)",
                         runs(c.get("running_again_s"), 3), ""])
        if fr.get("worker"):
            w = fr["worker"]
            rows.append(["forq", "whole supervisor",
                         f"{n(get(w, 'running_again_s', 'median'), 2)} s",
                         runs(w.get("running_again_s"), 2),
                         f"lease_ttl {w['lease_ttl_s']:g} s, reaper {w['reaper_interval_s']:g} s"
                         + ("; a child outlived its supervisor" if w.get("orphaned_child")
                            else "; the child died with it (PDEATHSIG)")])
        for system, label in (("rq-fork", "RQ"), ("celery", "Celery"), ("dramatiq", "Dramatiq")):
            for kind in ("child", "worker"):
                d = get(rec, system, kind)
                if not d:
                    continue
                if "error" in d:
                    rows.append([label, kind, "error", "", d["error"][-200:]])
                    continue
                med = get(d, "seconds", "median")
                value = (f"{med:.2f} s" if med is not None and not d.get("never")
                         else f"never (> {d['cap_s']:.0f} s)")
                notes = "; ".join(x for x in d.get("notes", []) if x)
                rows.append([label, kind if kind == "child" else "whole worker", value,
                             runs(d.get("seconds"), 2), notes])
        out.append(table(["system", "killed", "job runs again after", "runs", "notes"], rows))
        out.append("")

    if "scale" in s:
        sc = s["scale"]
        out.append("## Scale: claim+ack at big backlogs\n")
        out.append("Through a supervisor's lease calls (`leasing(queue)`: `claim` then `ack`), one client: "
                   "*claim 1* is one claim and one ack per job (a supervisor with one free slot), "
                   "*claim 100* claims 100 and pipelines their acks. The backlog is refilled after "
                   "each measure, so it stays where it was.\n")
        rows = []
        base = sc.get("1000") or {}
        for d in sc.values():
            sup = d.get("supervisor") or {}
            rows.append([n(d["backlog"]), n(d["claim_ack_1"]), n(d["claim_ack_100"]),
                         f"{d['claim_ack_100'] / base['claim_ack_100']:.2f}" if base else "",
                         n(d["redis_bytes_per_job"]), n(d["fill_jobs_per_s"]),
                         f"{n(sup.get('jobs_per_s'))} jobs/s, {mib(sup.get('supervisor_rss'))}"
                         if sup else ""])
        out.append(table(["backlog", "claim 1 + ack, jobs/s", "claim 100 + acks, jobs/s",
                          "÷ 1k (claim 100)", "Redis bytes per queued job",
                          "enqueue_many while filling, jobs/s",
                          "supervisor draining its top (rate, RSS)"], rows))
        out.append("")

    if s.get("appsize"):
        from bench import appsize

        a = s["appsize"]
        out.append("## Application size: fork per job with a real application loaded\n")
        out.append("Each worker holds an application loaded at its start (`bench/apps`): 20, 100 "
                   "or 300 MiB of small Python objects built at import, or a real import set "
                   "(Django set up with the contrib apps and a shop app's models and admin, "
                   "pandas, numpy). forq's fork server holds it, and each job's child is a fork "
                   "of it (forq's default configuration: `[supervisor].huge_pages` on; at 300 "
                   "MiB also off, the \"before\"); RQ's forking Worker ×2 is started by a script "
                   "that imports the application first, as RQ's docs advise for a big one, so "
                   "each work horse inherits it; Dramatiq's 2 processes × 1 thread each load it "
                   "and run every job in the same process. No-op jobs, enqueued first; "
                   f"{a.get('rounds')} round{'s' if (a.get('rounds') or 1) > 1 else ''}, the systems and sizes alternating.\n")
        out.append(appsize.render(a))
        out.append("")

    if "ceiling" in s:
        from bench.ceiling import render as render_ceiling

        c = s["ceiling"]
        out.append("## The Redis ceiling: one shard, many supervisors\n")
        out.append("No-op jobs with a realistic payload (a mail job's arguments, ≈ 170 bytes of "
                   "JSON), all enqueued first, drained by 8 worker processes on one Redis: forq "
                   "as 8 simulated supervisors of 50 slots (what a supervisor sends per round "
                   "trip — a claim for its free slots, the extension of its leases every ttl/3, "
                   "one ack call for the jobs done — without forking), BullMQ "
                   f"{c.get('bullmq_version') or ''} as 8 Node workers of concurrency 50, RQ as "
                   "8 SimpleWorkers, Dramatiq as 8 processes × 8 threads. Per job, between the "
                   "first finished job and the last: commands Redis ran (INFO commandstats, "
                   "those inside scripts included) and Redis CPU (INFO cpu, user + sys). The "
                   "**ceiling** is jobs per Redis CPU second: the rate one shard carries when "
                   "Redis has a core of its own. Here the clients share 2 cores with Redis, so "
                   "the measured rates stay far below it.\n")
        out.append(render_ceiling(c))
        rows = [[system, ", ".join(f"{k} {v}" for k, v in list(d["commands_top"].items())[:8])]
                for system, d in c.items() if isinstance(d, dict) and "commands_top" in d]
        out.append("")
        out.append(table(["system", "most frequent commands per job"], rows))
        out.append("")

    if with_findings:
        out.append(findings())
    else:
        out.append("\nWhat profiling found, on either host: bench/FINDINGS.md (this host: "
                   "Findings XV).\n")
    out.append(METHOD)
    return "\n".join(out)


def findings(path: Path = FINDINGS_PATH) -> str:
    """bench/FINDINGS.md's sections (its title and preface are for the file alone)."""
    text = path.read_text()
    start = text.find("\n## ")
    if start < 0:
        raise ValueError(f"{path}: no '## ' section to append to RESULTS.md")
    return "\n" + text[start + 1:]


METHOD = """
## How to run, and what is where

`.venv/bin/python -m bench` (full, under 10 minutes on 2 cores), `--quick` (about 2.5 minutes),
`--skip-1m`, `--only SECTION,...` (limits, enqueue, e2e, appsize, latency, recovery,
scale, ceiling, leases), `python -m bench.appsize` for the application-size axis alone,
`python -m bench.prefetch` for what `prefetch` buys and costs a fleet,
`python -m bench.chunks` for chunked handlers beside Dramatiq 2 × 1,
`python -m bench.childcost` for a job's child's CPU and faults, forked lean or not, `python -m bench.ceiling` for the Redis ceiling alone (`--n`, `--procs`,
`--slots`, `--only forq,bullmq`), `python -m bench.leases` for one supervisor holding
1,000 leases, `python -m bench.redis_cost` for a lone supervisor's Redis cost per job,
pick-up and idle CPU against issue 27's targets (`--baseline` another checkout's python,
`--base-commit` another commit's scripts), `python -m bench.script_split` for where the
lease scripts' Redis time goes (their commands or Lua around them),
`--no-profile`. `.venv/bin/python -m bench.supervisor` gives the supervisor's own
figures (issue 3) alone. The peers run from `bench/.venv-peers` (created on first use
with pip), each worker as its own CLI would start it (`rq worker -w ...`,
`celery -A celery_app worker -P prefork -c 2`, `dramatiq --processes 2 --threads 1`);
their apps are in `bench/peers/`. The forq handlers are in `bench/tasks.py`. The
experiments behind the findings (proposed fixes as monkeypatches, the fork-server
prototype, the latency split) were in `bench/experiments/` until their fixes landed (git history, commit 8b1b213).
"""
