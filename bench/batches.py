"""Batches and dependencies: what a batch member's end adds to the ack, beside a plain
job's ack, in one run on one private Redis.

    .venv/bin/python -m bench.batches                  # 20,000 jobs per scenario
    .venv/bin/python -m bench.batches --jobs 5000 --rounds 3

Each scenario enqueues `--jobs` jobs on a fresh queue, claims them 32 at a time (a
supervisor's claim batch) and acks each claim's jobs in one ack call (a supervisor's
batched acks), through the public lease API from one client. Only the ack calls are
timed and counted (Redis commands per job from INFO commandstats, commands inside the
scripts included):

* ``plain``: jobs that belong to no batch (the path every job takes, the baseline);
* ``batch member``: the members of one batch of `--jobs` (the counter, its ended set,
  and, for the last one, the callback);
* ``with a dependent``: plain jobs each with one job waiting on it (depends_on), whose
  ack releases it to pending.
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

from bench.common import RedisServer, command_calls, commands_per_job, log  # noqa: E402
from forq import Queue  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.supervisor.leases.calls import leasing

CLAIM = 32


def fill(q: Queue, scenario: str, jobs: int) -> None:
    if scenario == "batch member":
        q.batch([{"task": "noop"} for _ in range(jobs)], on_complete="noop.done")
    elif scenario == "with a dependent":
        parents = q.enqueue_many([{"task": "noop"} for _ in range(jobs)])
        q.enqueue_many([{"task": "noop.child", "depends_on": [p.id]} for p in parents])
    else:
        q.enqueue_many([{"task": "noop"} for _ in range(jobs)])


def drain_acks(q: Queue, jobs: int) -> tuple[float, dict[str, Any]]:
    """Claim and ack `jobs` jobs; returns (seconds spent in acks, commands per job)."""
    spent, acked = 0.0, 0
    before = command_calls(q.redis)
    claims = 0
    while acked < jobs:
        leases = leasing(q).claim("bench", min(CLAIM, jobs - acked), 600000).leases
        claims += 1
        if not leases:
            raise RuntimeError(f"nothing to claim after {acked} of {jobs}")
        t0 = time.perf_counter()
        leasing(q).ack_many([(lease.id, lease.token, "null", []) for lease in leases])
        spent += time.perf_counter() - t0
        acked += len(leases)
    after = command_calls(q.redis)
    # the claims' own commands are the same in every scenario: subtract none, but say so
    return spent, commands_per_job(before, after, jobs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    scenarios = ("plain", "batch member", "with a dependent")
    results: dict[str, list[tuple[float, float]]] = {s: [] for s in scenarios}
    with RedisServer() as server:
        r = connect(server.url())
        for rnd in range(args.rounds):
            for scenario in scenarios:  # interleaved: load changes hit every scenario alike
                q = Queue("b" + uuid.uuid4().hex[:8], redis=r)
                fill(q, scenario, args.jobs)
                spent, per = drain_acks(q, args.jobs)
                results[scenario].append((spent / args.jobs * 1e6, per["total"]))
                log(f"round {rnd + 1} {scenario}: {spent / args.jobs * 1e6:.1f} µs/job in acks, "
                    f"{per['total']:.2f} commands/job (claims included)")
                r.flushdb()
    base_us = min(us for us, _ in results["plain"])
    base_cmds = results["plain"][0][1]
    report = {name: {"ack_us_per_job": round(min(us for us, _ in rows), 2),
                     "ratio_to_plain": round(min(us for us, _ in rows) / base_us, 3),
                     "commands_per_job": round(rows[0][1], 2),
                     "extra_commands_per_job": round(rows[0][1] - base_cmds, 2)}
              for name, rows in results.items()}
    print(json.dumps({"jobs": args.jobs, "rounds": args.rounds, "claim_batch": CLAIM,
                      "scenarios": report}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
