"""What a job's child costs, forked by `os.fork()` or by the fork server's lean fork.

    python -m bench.childcost [--imports bench.tasks] [--forks 300] [--rounds 5]
                              [--huge-pages]

One process set up as the fork server is (forq's fork server module and the handler
modules imported, setproctitle initialised, the heap frozen) forks, in alternating
rounds: a child that `_exit`s at once, and a child that runs a no-op job through
`run_child` (its result read from its channel, as the supervisor would), each by
`os.fork()` (which runs Python's after-fork hooks) and by `leanfork.fork()` (which
skips them when they have nothing to do: `supervisor/fork/leanfork.py`). Prints the
CPU and minor page faults per child (rusage) and the lean fork's ratio to `os.fork()`.
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
from collections.abc import Callable

FIELDS = ("parent_ms", "child_ms", "parent_faults", "child_faults")


def _setup(imports: list[str], huge_pages: bool = False) -> None:
    from forq import registry
    from forq.supervisor.fork import leanfork, server  # noqa: F401 — the server's imports

    leanfork.watch_registrations()  # as the fork server does, before handler modules
    for name in imports:
        importlib.import_module(name)
    registry.preload_runtime()
    import setproctitle

    setproctitle.setproctitle("forq: fork server")
    gc.collect()
    gc.freeze()
    if huge_pages:  # as the fork server does last (`[supervisor].huge_pages`)
        from forq.supervisor.fork import hugepages

        print(hugepages.report("collapse", hugepages.collapse()), file=sys.stderr)


def _job_child(fork: Callable[[], int]) -> None:
    from forq.supervisor.fork.child import ChildSpec, run_child
    from forq.supervisor.fork.messages import channel

    request = json.dumps({"title": "forq: job bench", "spec": {
        "job_id": "0123456789abcdef0123", "queue": "bench", "task": "bench.noop",
        "args": [], "kwargs": {}, "attempts": 0, "crashes": 0,
        "memory_limit": 512 << 20, "max_result_bytes": 1 << 20}}).encode()
    message = json.loads(request)  # decoded in the fork server, as a request is
    spec = ChildSpec(**message["spec"])
    ours, theirs = channel()
    out_r, out_w = os.pipe()
    parent = os.getpid()
    pid = fork()
    if pid == 0:
        os.close(ours)
        os.close(out_r)
        run_child(spec, theirs, parent, message["title"], out_w)
    os.close(theirs)
    os.close(out_w)
    said = b""
    while chunk := os.read(ours, 65536):
        said += chunk
    os.close(ours)
    os.close(out_r)
    os.waitpid(pid, 0)
    if b'"ok":true' not in said:
        raise RuntimeError(f"the job's child did not report success: {said[:200]!r}")


def _bare_child(fork: Callable[[], int]) -> None:
    pid = fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _measure(one: Callable[[], None], n: int) -> dict[str, float]:
    self0 = resource.getrusage(resource.RUSAGE_SELF)
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(n):
        one()
    self1 = resource.getrusage(resource.RUSAGE_SELF)
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)

    def cpu(a: resource.struct_rusage, b: resource.struct_rusage) -> float:
        return (b.ru_utime - a.ru_utime + b.ru_stime - a.ru_stime) / n * 1000

    return {"parent_ms": cpu(self0, self1), "child_ms": cpu(kids0, kids1),
            "parent_faults": (self1.ru_minflt - self0.ru_minflt) / n,
            "child_faults": (kids1.ru_minflt - kids0.ru_minflt) / n}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--imports", default="bench.tasks", help="handler modules, comma-separated")
    p.add_argument("--forks", type=int, default=300, help="children per round and kind")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--huge-pages", action="store_true",
                   help="collapse the heap onto huge pages first, as the fork server does")
    args = p.parse_args(argv)
    _setup([m for m in args.imports.split(",") if m], args.huge_pages)
    from forq.supervisor.fork import leanfork

    if leanfork.blocker().endswith(" threads"):  # numpy's OpenBLAS stops its threads at
        _bare_child(os.fork)  # a fork, as the fork server's first job's fork does
    if leanfork.blocker():
        print(f"no lean fork here: {leanfork.blocker()}", file=sys.stderr)
        return 1
    kinds = {
        "exit at once, os.fork()": lambda: _bare_child(os.fork),
        "exit at once, lean fork": lambda: _bare_child(leanfork.fork),
        "no-op job, os.fork()": lambda: _job_child(os.fork),
        "no-op job, lean fork": lambda: _job_child(leanfork.fork),
    }
    for one in kinds.values():  # warm up
        _measure(one, max(1, args.forks // 10))
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        for kind, one in kinds.items():
            runs[kind].append(_measure(one, args.forks))
    median = {kind: {f: statistics.median(r[f] for r in rs) for f in FIELDS}
              for kind, rs in runs.items()}
    print(f"{'child':26} {'parent ms':>9} {'child ms':>9} {'faults p':>9} {'faults c':>9}")
    for kind, m in median.items():
        print(f"{kind:26} {m['parent_ms']:9.3f} {m['child_ms']:9.3f} "
              f"{m['parent_faults']:9.0f} {m['child_faults']:9.0f}")
    for what in ("exit at once", "no-op job"):
        lean, full = median[f"{what}, lean fork"], median[f"{what}, os.fork()"]
        print(f"{what}: a lean fork's child costs {lean['child_ms'] / full['child_ms']:.2f}× "
              f"the CPU of an os.fork() child "
              f"({full['child_ms'] - lean['child_ms']:.2f} ms less), "
              f"parent and child {(lean['parent_ms'] + lean['child_ms']) / (full['parent_ms'] + full['child_ms']):.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
