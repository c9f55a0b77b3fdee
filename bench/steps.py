"""Progress and durable steps: what they cost a job, against the plain no-op job, in one
run on one private Redis and one supervisor (concurrency 2).

    .venv/bin/python -m bench.steps                  # 400 jobs per scenario, 3 rounds
    .venv/bin/python -m bench.steps --jobs 1000 --rounds 5

Scenarios, in turn within each round (so load drifts hit them alike):

* ``noop``: `bench.noop`, the baseline;
* ``progress ×1000``: a handler that calls `current().progress` 1,000 times;
* ``1 step``: a handler with one durable step (a round trip child → supervisor → Redis →
  child before it returns);
* ``20 steps``: twenty steps one after another: their time per step is the step's
  latency as a handler sees it.

For each: jobs/s end to end (enqueue_many, then drained), the ratio to ``noop`` of the
same round, and Redis commands per job (INFO commandstats, inside scripts included).
Prints one JSON object; medians over the rounds.
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
    commands_per_job,
    log,
    median,
    wait_until,
    workdir,
    write_forq_config,
)
from forq import Queue  # noqa: E402

SCENARIOS: dict[str, tuple[str, list[Any]]] = {
    "noop": ("bench.noop", []),
    "progress x1000": ("bench.progress", [1000]),
    "1 step": ("bench.steps", [1]),
    "20 steps": ("bench.steps", [20]),
}


def drain(queue: Queue, task: str, args: list[Any], jobs: int) -> tuple[float, dict[str, Any]]:
    """jobs/s of `jobs` jobs of `task`, and Redis commands per job."""
    polls = 0

    def done() -> bool:
        nonlocal polls
        polls += 1  # one HGET: subtracted from the commands per job
        return int(queue.redis.hget(queue.keys.stats, "succeeded") or 0) >= jobs

    before = command_calls(queue.redis)
    started = time.perf_counter()
    queue.enqueue_many([{"task": task, "args": args} for _ in range(jobs)])
    wait_until(done, 600, 0.05, f"{jobs} {task}")
    elapsed = time.perf_counter() - started
    after = command_calls(queue.redis)
    return jobs / elapsed, commands_per_job(before, after, jobs, {"hget": polls})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    rates: dict[str, list[float]] = {name: [] for name in SCENARIOS}
    ratios: dict[str, list[float]] = {name: [] for name in SCENARIOS}
    commands: dict[str, Any] = {}
    with RedisServer() as server:
        for rnd in range(args.rounds):
            for name, (task, task_args) in SCENARIOS.items():
                queue_name = f"bench-steps-{uuid.uuid4().hex[:8]}"
                config = write_forq_config(workdir() / "steps.toml", server.url(), queue_name,
                                           imports=("bench.tasks", "bench.steps_tasks"))
                with ForqSupervisor(config, workdir() / "steps-supervisor.log"):
                    queue = Queue(queue_name, url=server.url())
                    rate, per_job = drain(queue, task, task_args, args.jobs)
                rates[name].append(rate)
                commands[name] = per_job
                log(f"round {rnd + 1}: {name}: {rate:.0f} jobs/s, "
                    f"{per_job['total']:.1f} commands/job")
            for name in SCENARIOS:
                ratios[name].append(rates[name][-1] / rates["noop"][-1])
    steps20 = median(rates["20 steps"])
    noop = median(rates["noop"])
    out = {
        "jobs": args.jobs, "rounds": args.rounds, "concurrency": 2,
        "jobs_per_s": {name: round(median(v) or 0, 1) for name, v in rates.items()},
        "ratio_to_noop": {name: round(median(v) or 0, 3) for name, v in ratios.items()},
        "commands_per_job": {name: round(c["total"], 1) for name, c in commands.items()},
        # 20 steps' extra time per job over a no-op's, over its 20 steps, with 2 slots busy
        "ms_per_step": (round((2 / steps20 - 2 / noop) * 1000 / 20, 2)
                        if steps20 and noop else None),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
