"""The machine's fork limit: `os.fork()` + `_exit` + `waitpid` per second, one after
another, in a process the size of a supervisor (its imports, a frozen heap, and padded
up to a given RSS so the page tables the kernel copies are as many).

    python -m bench.forkrate [--imports a,b] [--pad-to BYTES] [--forks N] [--reps R]

Prints one JSON object: forks_per_s (median of R runs of N forks), runs, rss.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import resource
import statistics
import sys
import time

DEFAULT_IMPORTS = "forq.supervisor.supervisor,forq.supervisor.cli,forq.examples,bench.tasks"


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def fork_rate(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--imports", default=DEFAULT_IMPORTS)
    p.add_argument("--pad-to", type=int, default=0, help="grow RSS to this many bytes")
    p.add_argument("--forks", type=int, default=1000)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    for name in filter(None, args.imports.split(",")):
        importlib.import_module(name)
    pad = None
    if args.pad_to > rss():
        pad = bytearray(args.pad_to - rss())
        for i in range(0, len(pad), 4096):  # touch every page: resident, like a heap
            pad[i] = 1
    gc.collect()
    gc.freeze()
    fork_rate(max(10, args.forks // 10))  # warm up
    self0, kids0 = (resource.getrusage(resource.RUSAGE_SELF),
                    resource.getrusage(resource.RUSAGE_CHILDREN))
    runs = [fork_rate(args.forks) for _ in range(args.reps)]
    self1, kids1 = (resource.getrusage(resource.RUSAGE_SELF),
                    resource.getrusage(resource.RUSAGE_CHILDREN))
    forks = args.forks * args.reps

    def per_fork(a, b, field):
        return (getattr(b, field) - getattr(a, field)) / forks

    json.dump({"forks_per_s": statistics.median(runs), "runs": runs, "rss": rss(),
               "padded": pad is not None,
               "parent_cpu_ms_per_fork": (per_fork(self0, self1, "ru_utime")
                                          + per_fork(self0, self1, "ru_stime")) * 1000,
               "child_cpu_ms_per_fork": (per_fork(kids0, kids1, "ru_utime")
                                         + per_fork(kids0, kids1, "ru_stime")) * 1000,
               "parent_minor_faults_per_fork": per_fork(self0, self1, "ru_minflt"),
               "child_minor_faults_per_fork": per_fork(kids0, kids1, "ru_minflt")},
              sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
