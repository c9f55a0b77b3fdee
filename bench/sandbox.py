"""What the sandbox costs: no-op jobs/s end to end through one supervisor (concurrency 2),
with each `[sandbox]` profile beside the default one, measured in the same run,
alternating, so the ratios are what to read.

    .venv/bin/python -m bench.sandbox [--jobs N] [--reps R] [--baseline PYTHON]

Profiles:
  default     no [sandbox] (output captured, environment scrubbed: always on)
  namespaces  a PID, mount and IPC namespace per job (`namespaces = true`)
  no-network  the same and a network namespace per job (`network = "none"`)
  full        run_as = "nobody", namespaces in a user namespace per job, no network,
              private /tmp: everything on (needs root, and a Python `nobody` can run:
              forq.testing.system_python builds one)
`--baseline PYTHON`: also run the default profile with another venv's python (e.g. one
with main's forq before the sandbox work) as "before".
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # `python bench/sandbox.py`
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path[0] = str(_Path(__file__).resolve().parent.parent)
    __package__ = "bench"

import argparse
import os
import sys

from bench.common import REPO, RedisServer, log, median
from bench.supervisor import drain_once

PROFILES = {
    "default": "",
    "namespaces": "\n[sandbox]\nnamespaces = true\n",
    "no-network": '\n[sandbox]\nnamespaces = true\nnetwork = "none"\n',
    "full": '\n[sandbox]\nrun_as = "nobody"\nnamespaces = true\nnetwork = "none"\n'
            'private_tmp = true\nrequire = ["run_as", "namespaces", "network", "private_tmp"]\n',
}


def _with_python(python: str) -> list[str]:
    """A launcher that runs `forq` with another interpreter (drain_once prepends it to
    `FORQ_PYTHON -m forq.supervisor.cli ...`)."""
    return ["sh", "-c", f'shift; exec {python} "$@"', "sh"]


def measure(jobs: int, reps: int, profiles: list[str],
            pythons: dict[str, str]) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {p: [] for p in profiles}
    with RedisServer() as server:
        for rep in range(reps):
            for profile in profiles if rep % 2 == 0 else profiles[::-1]:
                python = pythons.get(profile)
                # an older forq ("before") speaks an older data format: a database of
                # its own, filled by its own client
                older = profile == "before"
                run = drain_once(server.url(1 if older else 0), jobs,
                                 supervisor_extra=PROFILES.get(profile, ""),
                                 launcher=_with_python(python) if python else None,
                                 producer=python if older else None)
                rates[profile].append(run["jobs_per_s"])
                log(f"{profile:11s} run {rep + 1}: {run['jobs_per_s']:.0f} jobs/s")
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sandbox", description=__doc__)
    parser.add_argument("--jobs", type=int, default=400, help="no-op jobs per run")
    parser.add_argument("--reps", type=int, default=3, help="runs per profile")
    parser.add_argument("--baseline", metavar="PYTHON", help="a venv's python for 'before'")
    args = parser.parse_args(argv)
    profiles = ["default", "namespaces", "no-network"]
    pythons: dict[str, str] = {}
    if os.geteuid() == 0:
        from forq.testing.system_python import Unavailable, venv_python

        try:
            pythons["full"] = str(venv_python(REPO))
            profiles.append("full")
        except Unavailable as exc:
            log(f"no 'full' profile: {exc}")
    else:
        log("no 'full' profile: run_as needs root")
    if args.baseline:
        PROFILES["before"] = ""
        pythons["before"] = args.baseline
        profiles.insert(0, "before")
    rates = measure(args.jobs, args.reps, profiles, pythons)
    base = median(rates["default"])
    print(f"end to end, {args.jobs} no-op jobs x {args.reps} runs per profile, concurrency 2:")
    for profile in profiles:
        rate = median(rates[profile])
        print(f"  {profile:11s} {rate:8.1f} jobs/s  {rate / base:6.3f} x default  (runs: "
              f"{', '.join(f'{r:.0f}' for r in rates[profile])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
