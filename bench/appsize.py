"""The application-size axis (issue 27): fork per job when the worker holds a real
application, not the benchmark's 20 MiB of forq and no-op handlers.

    .venv/bin/python -m bench.appsize [--quick] [--apps heap:20,heap:300,real]

Each worker loads the application at start (`bench/apps`): 20, 100 or 300 MiB of small
Python objects built at import (`heap:MiB`), or a real import set (`real`: Django set
up with the contrib apps and a shop app's models and admin, pandas and numpy). Beside
forq (its fork server holds the application; every job's child is a fork of it):

* RQ's forking Worker ×2, started as RQ's docs advise for a big application, by a
  script that imports the application before the worker starts, so that every work
  horse (one fork per job) inherits it (`bench/peers/rq_app_worker.py`);
* Dramatiq 2 processes × 1 thread, each process with the application loaded, which
  runs every job in the same process (no fork); at the sizes of the targets only (its rate does not depend on it).

forq runs its default configuration (huge pages on); at 300 MiB it also runs with
`[supervisor].huge_pages = false`, the "before" of the same run. No-op jobs, enqueued
first, drained by 2 worker processes; the rate is taken from the first finished job to
the last. Rounds alternate the systems and sizes, so load from elsewhere hits all alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from bench.common import RedisServer, log, median, summary

LABELS = {"heap:20": "20 MiB", "heap:100": "100 MiB", "heap:300": "300 MiB",
          "real": "Django + pandas + numpy"}
BASE = "heap:20"  # the size the others are compared with
BIG = "heap:300"  # the size of the target, also measured with huge pages off
IMPORTS = ("bench.apps.forq_app",)
TARGET_KEEP = 0.8  # forq at BIG ≥ this × its rate at BASE
TARGET_RQ = 3.0  # forq ≥ this × RQ's forking worker at every size


class Sizes:
    """One round (the sizes alternate within it): two would take a full `python -m bench`
    past 10 minutes on 2 cores; `python -m bench.appsize --rounds N` for more."""

    def __init__(self, quick: bool) -> None:
        # --quick: the two sizes of the targets (python -m bench --quick stays under 4 min)
        self.apps = ("heap:20", "heap:300") if quick else \
            ("heap:20", "heap:100", "heap:300", "real")
        self.rounds = 1
        self.forq = 300 if quick else 600
        # huge pages off at 300 MiB (3-4 times slower): the full run's "before" only
        self.forq_off = 0 if quick else self.forq // 4
        self.rq = 60 if quick else 150
        self.dramatiq = 300 if quick else 600
        # Dramatiq does not fork per job: its rate does not depend on the size, so it
        # runs at the sizes of the targets only
        self.dramatiq_apps = ("heap:20", "heap:300", "real")


def measure(url: str, redis_base: str, sz: Sizes,
            run_driver: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    from bench import supervisor as forq_sup

    forq: dict[str, list[dict[str, Any]]] = {app: [] for app in sz.apps}
    forq_off: list[dict[str, Any]] = []
    peers: dict[str, dict[str, list[dict[str, Any]]]] = {
        "rq-fork-app": {app: [] for app in sz.apps}, "dramatiq": {app: [] for app in sz.apps}}
    for i in range(sz.rounds):
        for app in sz.apps:
            log(f"appsize: round {i + 1}/{sz.rounds}, {LABELS.get(app, app)}: forq "
                f"{sz.forq}{' (and huge pages off)' if app == BIG and sz.forq_off else ''}, "
                f"RQ {sz.rq}"
                f"{f', Dramatiq {sz.dramatiq}' if app in sz.dramatiq_apps else ''} ...")
            env = {"BENCH_APP": app}
            forq[app].append(forq_sup.drain_once(url, sz.forq, imports=IMPORTS, env=env))
            if app == BIG and sz.forq_off:
                forq_off.append(forq_sup.drain_once(url, sz.forq_off, imports=IMPORTS, env=env,
                                                    supervisor_extra="huge_pages = false"))
            for system, n in (("rq-fork-app", sz.rq), ("dramatiq", sz.dramatiq)):
                if system == "dramatiq" and app not in sz.dramatiq_apps:
                    continue
                peers[system][app].append(run_driver("drain", system, redis_base, 1, n=n,
                                                     reps=1, app=app))
    out: dict[str, Any] = {"apps": list(sz.apps), "rounds": sz.rounds,
                           "forq": {}, "forq-no-huge-pages": {}, "rq-fork-app": {},
                           "dramatiq": {}}
    for app in sz.apps:
        out["forq"][app] = _forq_summary(forq[app], sz.forq)
        for system in peers:
            runs = peers[system][app]
            if not runs:
                continue
            out[system][app] = dict(summary([r["median"] for r in runs]), n=runs[0]["n"],
                                    worker_rss=median(r.get("worker_rss") for r in runs))
    if forq_off:
        out["forq-no-huge-pages"][BIG] = _forq_summary(forq_off, sz.forq_off)
    return out


def _forq_summary(runs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    from bench.supervisor import throughput_summary

    out = throughput_summary(runs, n)
    out["fork_server_rss"] = median(r.get("fork_server_rss") for r in runs)
    out["huge_pages"] = runs[-1].get("fork_server_pages", "")
    return out


def ratios(res: dict[str, Any]) -> dict[str, Any]:
    """forq at each size ÷ forq at BASE, and ÷ RQ's forking worker at the same size."""
    forq = res.get("forq", {})
    base = (forq.get(BASE) or {}).get("median")
    out: dict[str, Any] = {"keep": {}, "vs_rq": {}, "vs_dramatiq": {}}
    for app, d in forq.items():
        rate = d.get("median")
        if not rate:
            continue
        if base:
            out["keep"][app] = rate / base
        for system, key in (("rq-fork-app", "vs_rq"), ("dramatiq", "vs_dramatiq")):
            peer = (res.get(system, {}).get(app) or {}).get("median")
            if peer:
                out[key][app] = rate / peer
    return out


def targets(res: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    r = ratios(res)
    forq = res.get("forq", {})
    out: list[tuple[str, str, str, bool | None]] = []
    if BIG in r["keep"]:
        keep = r["keep"][BIG]
        out.append(("application size: forq with a 300 MiB heap ≥ 0.8× its rate at 20 MiB "
                    "(#27)", f"≥ {TARGET_KEEP}×",
                    f"{keep:.2f}× ({forq[BIG]['median']:,.0f} vs {forq[BASE]['median']:,.0f} "
                    "jobs/s)", keep >= TARGET_KEEP))
    if r["vs_rq"]:
        worst = min(r["vs_rq"], key=r["vs_rq"].get)
        every = ", ".join(f"{LABELS.get(a, a)} {v:.1f}×" for a, v in r["vs_rq"].items())
        out.append(("application size: forq ≥ 3× RQ's forking worker (app preloaded) at "
                    "every size (#27)", f"≥ {TARGET_RQ}×", every,
                    r["vs_rq"][worst] >= TARGET_RQ))
    return out


def render(res: dict[str, Any]) -> str:
    r = ratios(res)
    rows = []
    for app in res.get("apps", []):
        f = res["forq"].get(app) or {}
        rq = res["rq-fork-app"].get(app) or {}
        dr = res["dramatiq"].get(app) or {}
        rows.append(_row(LABELS.get(app, app), f, r["keep"].get(app), rq, dr,
                         r["vs_rq"].get(app)))
        off = res.get("forq-no-huge-pages", {}).get(app)
        if off:
            base = (res["forq"].get(BASE) or {}).get("median")
            keep = off["median"] / base if base else None
            vs = off["median"] / rq["median"] if rq.get("median") else None
            rows.append(_row(f"{LABELS.get(app, app)}, `huge_pages = false`", off, keep,
                             {}, {}, vs))
    out = [_table(["application loaded at import", "forq fork server", "forq jobs/s",
                   "÷ forq at 20 MiB", "forq CPU per job: supervisor / fork server / child "
                   "/ Redis", "page faults per job: fork server / child",
                   "RQ forking worker ×2, jobs/s (RSS)", "forq ÷ RQ",
                   "Dramatiq 2 × 1, jobs/s", "runs (forq; RQ)"], rows)]
    return "\n".join(out)


def _row(label: str, f: dict[str, Any], keep: float | None, rq: dict[str, Any],
         dr: dict[str, Any], vs_rq: float | None) -> list[str]:
    def num(x: Any) -> str:
        return "" if x is None else f"{x:,.0f}"

    rss = f.get("fork_server_rss")
    pages = f.get("huge_pages") or ""
    server = (f"{rss / 2**20:.0f} MiB" if rss else "") + (f"; {_short(pages)}" if pages else "")
    def ms(key: str) -> str:
        return "?" if f.get(key) is None else f"{f[key]:.2f}"

    cpu = (f"{ms('parent_cpu_ms_per_job')} / {ms('fork_server_cpu_ms_per_job')} / "
           f"{ms('child_cpu_ms_per_job')} / {ms('redis_cpu_ms_per_job')} ms") if f else ""
    faults = (f"{num(f.get('fork_server_faults_per_job'))} / "
              f"{num(f.get('child_faults_per_job'))}") if f else ""
    rq_rss = rq.get("worker_rss")
    return [label, server, num(f.get("median")), "" if keep is None else f"{keep:.2f}×", cpu,
            faults,
            (num(rq.get("median")) + (f" ({rq_rss / 2**20:.0f} MiB)" if rq_rss else ""))
            if rq else "", "" if vs_rq is None else f"{vs_rq:.1f}×",
            num(dr.get("median")) if dr else "",
            "; ".join(x for x in (_runs(f), _runs(rq)) if x)]


def _short(pages: str) -> str:
    """'310 of 315 MiB of its memory on huge pages (...)' → '310 MiB on huge pages'."""
    words = pages.split()
    if len(words) > 3 and words[1] == "of" and words[3] == "MiB":
        return f"{words[0]} MiB on huge pages"
    return pages.split(" (")[0]


def _runs(d: dict[str, Any]) -> str:
    return ", ".join(f"{x:,.0f}" for x in d.get("runs") or [])


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from bench.__main__ import run_driver
    from bench.peers import venv

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--apps", help="comma-separated: heap:MiB or real (default: by --quick)")
    p.add_argument("--rounds", type=int)
    args = p.parse_args(argv)
    sz = Sizes(args.quick)
    if args.apps:
        sz.apps = tuple(args.apps.split(","))
    if args.rounds:
        sz.rounds = args.rounds
    venv.ensure(log)
    with RedisServer() as server:
        res = measure(server.url(0), f"redis://127.0.0.1:{server.port}", sz, run_driver)
    print(render(res), file=sys.stderr)
    for name, goal, got, ok in targets(res):
        print(f"{name}: {got} (goal {goal}: {'met' if ok else 'MISSED'})", file=sys.stderr)
    json.dump(res, sys.stdout, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
