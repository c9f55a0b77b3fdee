"""What per-job cgroups cost: no-op jobs/s end to end through one supervisor
(concurrency 2) with `job_cgroups = "required"`, beside `"off"` (RSS sampling) measured
in the same run, alternating, so the ratio is what to read.

    .venv/bin/python -m bench.cgroups [--jobs N] [--reps R]

Each job in a cgroup of its own costs the supervisor a mkdir, three small writes and an
rmdir, and the child one write to cgroup.procs: a cgroup migration, which on a cgroup2
mounted without ``favordynmods`` waits for an RCU grace period (cgroup_threadgroup_rwsem).
On a host without cgroup v2 delegation (ours are v1/hybrid) the benchmark re-runs itself
in the cgroup v2 VM of tests/vm.py, and there measures twice: as mounted, then after
``mount -o remount,favordynmods`` (never done to a real host). That VM is software
emulation: absolute figures are many times lower than on the host; read the ratios.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # `python bench/cgroups.py`
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path[0] = str(_Path(__file__).resolve().parent.parent)
    __package__ = "bench"

import argparse
import os
import subprocess
import sys

from bench.common import RedisServer, log, median
from bench.supervisor import drain_once
from tests import vm

MODES = ("off", "required")


def measure(jobs: int, reps: int) -> dict[str, list[float]]:
    """jobs/s per mode, `reps` runs each, the modes alternating."""
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    with RedisServer() as server:
        for rep in range(reps):
            for mode in MODES if rep % 2 == 0 else MODES[::-1]:
                base = vm.delegated_cgroup("forq-bench")
                try:
                    # `forq` starts in its own cgroup, as under systemd with Delegate=yes
                    enter = ["sh", "-c", f'echo $$ > {base}/cgroup.procs && exec "$@"', "sh"]
                    run = drain_once(server.url(), jobs, launcher=enter,
                                     supervisor_extra=f'job_cgroups = "{mode}"')
                finally:
                    vm.remove_cgroup_tree(base)
                rates[mode].append(run["jobs_per_s"])
                log(f"job_cgroups = {mode:8s} run {rep + 1}: {run['jobs_per_s']:.0f} jobs/s")
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cgroups", description=__doc__)
    parser.add_argument("--jobs", type=int, default=400, help="no-op jobs per run")
    parser.add_argument("--reps", type=int, default=3, help="runs per mode")
    args = parser.parse_args(argv)
    problem = vm.cgroup_v2_problem()
    if problem:
        if os.environ.get("FORQ_IN_VM"):
            print(f"bench.cgroups: no cgroup v2 delegation in the VM: {problem}",
                  file=sys.stderr)
            return 1
        log(f"this host: {problem}; running in a cgroup v2 VM (software emulation)")
        try:
            rc, console = vm.run([sys.executable, "-m", "bench.cgroups", "--jobs",
                                  str(args.jobs), "--reps", str(args.reps)], timeout=1800)
        except vm.VMUnavailable as exc:
            print(f"bench.cgroups: {exc}", file=sys.stderr)
            return 1
        sys.stdout.write(console)
        return rc if rc >= 0 else 1
    in_vm = bool(os.environ.get("FORQ_IN_VM"))
    mounts = ["as mounted", "favordynmods"] if in_vm else ["as mounted"]
    for mount in mounts:
        if mount == "favordynmods":
            subprocess.run(["mount", "-o", "remount,favordynmods", vm.CGROUP_ROOT], check=True)
        rates = measure(args.jobs, args.reps)
        off, on = median(rates["off"]), median(rates["required"])
        where = "in the VM (TCG)" if in_vm else "on this host"
        print(f"end to end, {args.jobs} no-op jobs x {args.reps} runs per mode, {where}, "
              f"cgroup2 {mount}:")
        for mode in MODES:
            print(f"  job_cgroups = {mode:9s} {median(rates[mode]):8.1f} jobs/s  (runs: "
                  f"{', '.join(f'{r:.0f}' for r in rates[mode])})")
        print(f"  ratio required/off      {on / off:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
