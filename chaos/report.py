"""The one-screen report, and the JSON written beside it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

REPORTS = Path(__file__).resolve().parent / "reports"
LABEL = {"rss": "RSS"}  # a soak's series names


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s"


def _lat(d: dict[str, Any]) -> str:
    if not d or not d.get("n"):
        return "none measured"
    return f"p50 {_ms(d['p50'])}  p99 {_ms(d['p99'])}  max {_ms(d['max'])}  (n={d['n']})"


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def _diverse(examples: list[str], n: int) -> list[str]:
    """Up to n examples, different kinds first (the text after the job id)."""
    out, kinds = [], set()
    for ex in examples:
        kind = ex.split(": ", 1)[-1][:25]
        if kind not in kinds:
            kinds.add(kind)
            out.append(ex)
    out += [ex for ex in examples if ex not in out]
    return out[:n]


def render(result: dict[str, Any]) -> str:
    s = result["settings"]
    st = result["stats"]
    lines = []
    verdict = "PASS" if result["ok"] else "FAIL"
    lines.append(f"forq chaos — {verdict}   seed {s['seed']}, {s['duration']:g}s, "
                 f"{s['supervisors']} supervisors × {s['concurrency']}, "
                 + (f"prefetch {s['prefetch']} on the odd ones, " if s.get("prefetch") else "")
                 + f"lease_ttl {s['lease_ttl']}s, reaper {s['reaper_interval']}s, "
                 "redis AOF fsync always"
                 + (f", BROKEN: {','.join(s['breaks'])}" if s["breaks"] else ""))
    states = st["states"]
    lines.append(f"jobs       told {st['told']} ({_counts(st['kinds'])})")
    lines.append(f"           succeeded {states.get('succeeded', 0)}, dead {states.get('dead', 0)}, "
                 f"lost {st['lost']}; enqueue errors {st['enqueue_errors']} "
                 f"(told after retry {st['told_after_retry']}, of which had landed "
                 f"{st['landed_before_told']}; never told {st['not_told']})")
    ch = st.get("chunks") or {}
    lines.append(f"executions {st['executions']} for {st['jobs_executed']} jobs; "
                 f"re-executions {st['re_executions']}"
                 + (f"; {ch['executions']} in {ch['chunks']} chunks of 1-{ch['largest']} jobs "
                    f"(mean {ch['mean']:g}, {ch['of_one']} of one; {ch['crashed']} crashed by "
                    f"a job, {ch['killed']} killed)" if ch.get("chunks") else ""))
    lines.append(f"  by cause {_counts(st['re_execution_causes'])}"
                 + (f"; idempotent extra completions (excused) "
                    f"{_counts(st['idempotent_excused'])}" if st.get("idempotent_excused") else ""))
    lines.append(f"dead by    {_counts(st['dead_reasons'])}")
    b = st.get("batches") or {}
    if b.get("batches"):
        skipped = st["states"].get("not enqueued", 0)
        lines.append(f"batches    {b['batches']}, {b.get('nested', 0)} opened by a member "
                     f"({_counts(b['by_status'])}"
                     + (f"; on_success not due {skipped}" if skipped else "") + "); callback runs "
                     f"{_counts(b['callback_runs'])}; re-runs {_counts(b['callback_reruns'])}")
        if b.get("relayed"):
            lines.append(f"           {b['relayed']} with a member on another queue; relay "
                         f"(last member's end to callback) {_lat(b['relay_delay'])}")
    faults = st["faults"]
    if st.get("operator"):
        lines.append(f"operator   {_counts(st['operator'])} (jobs changed while they waited)")
    stalls = st.get("redis_stalls_uninjected")
    lines.append(f"faults     {sum(faults.values())}: {_counts(faults)}"
                 + (f"; skipped {_counts(st['faults_skipped'])}" if st["faults_skipped"] else "")
                 + f"; redis down {st['redis_outage_s']}s in all"
                 + (f"; stalled on its own {len(stalls)} time(s), longest "
                    f"{max(d for _, d in stalls):.2f}s (slow disk/host; PING > 250 ms)"
                    if stalls else ""))
    lat = st["latency"]
    lines.append(f"reclaim    supervisor kill  {_lat(lat['sup_kill'])}")
    lines.append(f"           supervisor stop  {_lat(lat['sup_stop'])}")
    lines.append(f"           child crash      {_lat(lat['child_crash'])}")
    lines.append(f"throughput {st['throughput']:.1f} jobs/s finished over {st['span_s']:.0f}s; "
                 f"settled in {result['settle_s']:.1f}s; wall {result['wall_s']:.0f}s")
    host = st.get("host") or {}
    if host.get("cpu_pressure_avg") is not None:
        lines.append(f"host       CPU pressure avg {host['cpu_pressure_avg']:.0f}% "
                     f"(max {host['cpu_pressure_max']:.0f}%); a supervisor waited for a CPU up "
                     f"to {host['supervisor_cpu_wait_share_max'] * 100:.0f}% of the time")
    lines.append("invariants")
    for inv in result["invariants"]:
        mark = "ok  " if inv["ok"] else "FAIL"
        lines.append(f"  [{mark}] {inv['number']}. {inv['name']}"
                     + ("" if inv["ok"] else f" — {inv['violations']} violation(s)"))
        shown = _diverse(inv["examples"], 3)
        for ex in shown:
            lines.append(f"           ! {ex[:150]}")
        if not inv["ok"] and inv["violations"] > len(shown):
            lines.append(f"           … {inv['violations'] - len(shown)} more in the JSON report")
    if result.get("soak"):
        lines += render_soak(result["soak"])
    for err in result.get("errors", []):
        lines.append(f"harness error: {err}")
    lines.append(f"report     {result['report_path']}")
    return "\n".join(lines)


def amount(metric: str, v: float | None, sign: bool = False) -> str:
    """A value of a soak's series for people: bytes in KiB/MiB/GiB, counts as counts."""
    if v is None:
        return "-"
    plus = "+" if sign and v >= 0 else ""
    if metric in ("rss", "used_memory"):
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if abs(v) >= size:
                return f"{plus}{v / size:.1f} {unit}"
        return f"{plus}{v:.0f} B"
    if float(v).is_integer() or abs(v) >= 10:
        return f"{plus}{v:.0f}"
    return f"{plus}{v:.2f}"


def render_soak(soak: dict[str, Any]) -> list[str]:
    """The soak's part of the screen: one row per series (each process's RSS and fds,
    Redis's memory and keys), its slope per minute and per hour, the slope's 95%
    interval per hour, and the verdict."""
    samples = soak["samples"]
    span = samples[-1]["t"] - samples[0]["t"] if len(samples) > 1 else 0.0
    tol = soak["tolerance"]
    lines: list[str] = [
        f"soak       {len(samples)} samples every {soak['interval']:g}s (low-water marks of 1 s "
        f"readings) over {span:.0f}s; each process judged after its first {soak['warmup']:.0f}s",
        "           a leak: the slope's whole 95% interval above "
        + ", ".join(f"{amount(m, tol[m][0])}/h {LABEL.get(m, m)}" for m in ("rss", "fds"))
        + ", and growth over",
        "           the judged window certainly above "
        + ", ".join(f"{amount(m, tol[m][1])} {LABEL.get(m, m)}" for m in ("rss", "fds")),
        f"  {'series':<26} {'first → last':>21} {'per min':>10} {'per hour':>10} "
        f"{'95% interval per hour':>24}  verdict"]
    for row in soak["series"]:
        m = row["metric"]
        name = f"{row['name']} {LABEL.get(m, m)}"
        if row.get("lifetimes", 1) > 1:
            name += f" (pid {row['pid']})"
        span_text = f"{amount(m, row['first'])} → {amount(m, row['last'])}"
        ci = (f"{amount(m, row.get('low_per_hour'), True)} … "
              f"{amount(m, row.get('high_per_hour'), True)}") if row["fit"] else "-"
        lines.append(f"  {name:<26} {span_text:>21} {amount(m, row.get('per_min'), True):>10} "
                     f"{amount(m, row.get('per_hour'), True):>10} {ci:>24}  {row['verdict']}")
    per_job = soak["redis_per_job"]
    if per_job.get("used_memory") is not None:
        why = ("memory judged: retention bounds it" if soak["redis_bounded"]
               else "not judged: retention off (chaos/soak.py RETENTION_DEFAULTS)")
        lines.append(f"  redis grows {amount('used_memory', per_job['used_memory'])} and "
                     f"{per_job['keys'] or 0:.2f} keys per job told ({why})")
    mark = "ok  " if soak["ok"] else "FAIL"
    lines.append(f"  [{mark}] no slow leak" + ("" if soak["ok"] else " — " + "; ".join(soak["problems"])))
    return lines


def default_path(seed: int) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return REPORTS / f"chaos-{stamp}-seed{seed}.json"


def write(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str))
