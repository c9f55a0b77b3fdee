"""Async enqueue throughput: `AsyncQueue` beside the sync `Queue` and arq, on one Redis.

    .venv/bin/python -m bench.asyncio_enqueue [--jobs 20000] [--rounds 3]

One private redis-server (no persistence) serves every client in turn, so each figure is
measured on the same server in the same run; each is the median of `--rounds` rounds
(the machine is shared), printed with its ratio to the baseline, the sync client's
single `enqueue` from one thread. Measured:

* sync `Queue.enqueue` (one round trip a job), and `enqueue_many` in batches of 100;
* `AsyncQueue.enqueue` with 1 and with 16 coroutines in flight on one client (its pool
  opens a connection per concurrent call), and `enqueue_many` in batches of 100 with 4
  in flight;
* arq's `enqueue_job` with 1 and 16 in flight (arq has no batch enqueue), in the peers'
  venv (bench/.venv-peers, made on first use).

Also printed: the client's CPU per job (user + system, `getrusage`: unlike a rate, it
barely moves when other processes load the machine) and Redis commands per job (INFO
stats), the cost the server pays.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.common import RedisServer, remove_queue  # noqa: E402
from bench.peers import venv as peers  # noqa: E402
from forq import AsyncQueue, Queue  # noqa: E402

BATCH = 100
QUEUE = "forqbench-async"
ARQ_DRIVER = Path(__file__).resolve().parent / "peers" / "arq_enqueue.py"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _commands(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


def sync_single(url: str, jobs: int) -> float:
    q = Queue(QUEUE, url=url)
    q.enqueue("noop", 0)  # registered, scripts loaded: steady state from here
    start = time.perf_counter()
    for i in range(jobs):
        q.enqueue("noop", i)
    return time.perf_counter() - start


def sync_batches(url: str, jobs: int) -> float:
    q = Queue(QUEUE, url=url)
    q.enqueue("noop", 0)
    start = time.perf_counter()
    for first in range(0, jobs, BATCH):
        q.enqueue_many([{"task": "noop", "args": [i]} for i in range(first, min(first + BATCH, jobs))])
    return time.perf_counter() - start


def async_run(url: str, jobs: int, concurrency: int, batch: int) -> float:
    async def main() -> float:
        async with AsyncQueue(QUEUE, url=url) as q:
            await q.enqueue("noop", 0)
            units = [list(range(first, min(first + batch, jobs))) for first in range(0, jobs, batch)]
            shares = [units[i::concurrency] for i in range(concurrency)]

            async def producer(mine: list[list[int]]) -> None:
                for unit in mine:
                    if batch == 1:
                        await q.enqueue("noop", unit[0])
                    else:
                        await q.enqueue_many([{"task": "noop", "args": [i]} for i in unit])

            start = time.perf_counter()
            await asyncio.gather(*(producer(mine) for mine in shares))
            return time.perf_counter() - start

    return asyncio.run(main())


def arq_run(port: int, jobs: int, concurrency: int) -> tuple[float, float, float]:
    out = subprocess.run([str(peers.python()), str(ARQ_DRIVER), str(port), str(jobs),
                          str(concurrency)], capture_output=True, text=True, check=True)
    reply = json.loads(out.stdout)
    return float(reply["seconds"]), float(reply["commands"]), float(reply["cpu"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-arq", action="store_true", help="skip arq (no peers' venv)")
    args = parser.parse_args(argv)
    if not args.no_arq:
        peers.ensure(log=lambda m: print(m, file=sys.stderr))
    with RedisServer() as server:
        url = server.url(1)
        client = redis.Redis(port=server.port, db=1)
        cases: list[tuple[str, Callable[[], float]]] = [
            ("sync enqueue, 1 thread", lambda: sync_single(url, args.jobs)),
            (f"sync enqueue_many x{BATCH}", lambda: sync_batches(url, args.jobs)),
            ("async enqueue, 1 in flight", lambda: async_run(url, args.jobs, 1, 1)),
            ("async enqueue, 16 in flight", lambda: async_run(url, args.jobs, 16, 1)),
            (f"async enqueue_many x{BATCH}, 4 in flight",
             lambda: async_run(url, args.jobs, 4, BATCH)),
        ]
        rates: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        per_job: dict[str, float] = {}
        for _round in range(args.rounds):
            for name, case in cases:
                before, cpu_before = _commands(client), _cpu()
                seconds = case()
                cpu.setdefault(name, []).append((_cpu() - cpu_before) / args.jobs)
                per_job[name] = (_commands(client) - before) / args.jobs
                rates.setdefault(name, []).append(args.jobs / seconds)
                remove_queue(client, QUEUE)
            if not args.no_arq:
                for n in (1, 16):
                    seconds, commands, cpu_s = arq_run(server.port, args.jobs, n)
                    name = f"arq enqueue_job, {n} in flight"
                    rates.setdefault(name, []).append(args.jobs / seconds)
                    cpu.setdefault(name, []).append(cpu_s / args.jobs)
                    per_job[name] = commands
    baseline = statistics.median(rates["sync enqueue, 1 thread"])
    print(f"enqueue throughput, {args.jobs} jobs x {args.rounds} rounds, median jobs/s "
          f"(load {os.getloadavg()[0]:.1f}, redis {server.version()})")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"  {name:<40} {rate:>9,.0f}  {rate / baseline:5.2f}x   "
              f"{statistics.median(cpu[name]) * 1e6:5.0f} us client CPU/job   "
              f"{per_job[name]:.2f} redis commands/job")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
