"""`python -m bench.web`: how fast `forq web` pages render with 1,000,000 pending and
100,000 dead jobs, beside the same pages over a near-empty queue in the same run, and
what the recently-finished index costs per job.

    .venv/bin/python -m bench.web                       # 1M pending, 100k dead (~2 min)
    .venv/bin/python -m bench.web --pending 100000 --dead 10000

Pages are fetched over HTTP from a real `forq web` process (uvicorn, Jinja2, the real
Redis reads); each figure is the median and p95 of --repeat fetches. The index cost:
claim+ack of --jobs jobs through the real scripts, beside the same with an ack script
whose index update is cut out, and the commands Redis ran per job (INFO commandstats).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.request
from typing import Any

from bench.common import REPO, RedisServer, command_calls, commands_per_job, free_port, log
from bench.common import median as _median
from bench.common import percentile as _percentile
from forq.supervisor.leases.calls import leasing

INDEX_LINES = ("    redis.call('ZADD', fkey, at, id)\n",
               "    redis.call('ZREMRANGEBYRANK', fkey, 0, -FINISHED_CAP - 1)\n")


def fill(client: Any, name: str, pending: int, dead: int) -> dict[str, float]:
    """`dead` jobs through enqueue, claim and a fatal fail; then `pending` enqueued."""
    from forq import Queue

    q = Queue(name, redis=client)
    took = {}
    start = time.perf_counter()
    for base in range(0, dead, 5000):
        n = min(5000, dead - base)
        q.enqueue_many([{"task": "bench.nop", "args": [base + i]} for i in range(n)])
        for _ in range(0, n, 1000):
            leases = leasing(q).claim("bench:1", 1000, 600_000).leases
            pipe = client.pipeline(transaction=False)
            for lease in leases:
                leasing(q).fail(lease.id, lease.token, {"reason": "bench: dead on purpose"},
                       mode="fatal", client=pipe)
            pipe.execute()
    took["dead_s"] = time.perf_counter() - start
    start = time.perf_counter()
    for base in range(0, pending, 10000):
        n = min(10000, pending - base)
        q.enqueue_many([{"task": "bench.nop", "args": [base + i], "priority": i % 3}
                        for i in range(n)])
    took["pending_s"] = time.perf_counter() - start
    return took


def fetch_times(base: str, paths: list[str], repeat: int) -> list[dict[str, Any]]:
    """Median and p95 ms of each path, fetched in turn (so drift in the machine's load
    falls on all of them alike)."""
    times: list[list[float]] = [[] for _ in paths]
    for _ in range(repeat):
        for i, path in enumerate(paths):
            start = time.perf_counter()
            with urllib.request.urlopen(base + path, timeout=30) as response:
                response.read()
                assert response.status == 200, path
            times[i].append((time.perf_counter() - start) * 1000)
    return [{"median_ms": round(_median(t), 2), "p95_ms": round(_percentile(t, 95), 2)}
            for t in times]


def index_cost(client: Any, jobs: int, rounds: int = 5) -> dict[str, Any]:
    """Redis-side time of one ack with and without the finished-index update (the
    server's own clock, INFO commandstats, so a busy client machine matters less), the
    index commands' own share of it, and the commands Redis runs per ack with it."""
    from forq import Queue
    from forq.store.scripts import source

    without = client.register_script(
        source("ack").replace(INDEX_LINES[0], "").replace(INDEX_LINES[1], ""))
    assert without.script != source("ack"), "the index lines of lua/includes/finish.lua changed"
    usec: dict[str, list[float]] = {"with": [], "without": []}
    index_usec: list[float] = []  # the two index commands' own time per ack
    ack_usec: list[float] = []  # ... and the whole ack's, in the same acks
    per_job = None
    for round_ in range(rounds):
        # alternate which goes first, so whatever the first of a pair pays (or leaves
        # behind for the second) falls on both alike
        for variant in (("with", "without") if round_ % 2 == 0 else ("without", "with")):
            q = Queue(f"idx-{variant}-{round_}", redis=client)
            q.enqueue_many([{"task": "bench.nop"} for _ in range(jobs)])
            leases = []
            while len(leases) < jobs:
                leases += leasing(q).claim("bench:1", 1000, 600_000).leases
            client.config_resetstat()
            for start in range(0, jobs, 500):
                pipe = client.pipeline(transaction=False)
                for lease in leases[start:start + 500]:
                    if variant == "with":
                        leasing(q).ack(lease.id, lease.token, "null", client=pipe)
                    else:
                        without(keys=[q.keys.active, q.keys.pending, q.keys.scheduled],
                                args=[q.keys.prefix, q.name, lease.id, lease.token, "null"],
                                client=pipe)
                pipe.execute()
            stats = client.info("commandstats")
            usec[variant].append(stats["cmdstat_evalsha"]["usec_per_call"])
            if variant == "with":  # after the reset only acks ran: their ZADDs are the index's
                index_usec.append(sum(stats.get(f"cmdstat_{name}", {}).get("usec", 0)
                                      for name in ("zadd", "zremrangebyrank")) / jobs)
                ack_usec.append(stats["cmdstat_evalsha"]["usec"] / jobs)
            if variant == "with" and per_job is None:
                per_job = commands_per_job({}, command_calls(client), jobs)  # since the reset
    with_us, without_us = _median(usec["with"]), _median(usec["without"])
    return {"jobs": jobs, "rounds": rounds, "ack_usec_with_index": round(with_us, 2),
            "ack_usec_without_index": round(without_us, 2),
            "ratio": round(with_us / without_us, 3), "commands_per_job": per_job,
            "index_usec_per_ack": round(_median(index_usec), 2),
            "of_ack_usec": round(_median(ack_usec), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.web")
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=20_000, help="for the index cost")
    args = parser.parse_args(argv)
    from forq.store.connection import connect

    with RedisServer() as server:
        client = connect(server.url())
        log(f"filling: {args.pending} pending, {args.dead} dead (real enqueue/claim/fail)")
        took = fill(client, "big", args.pending, args.dead)
        fill(client, "small", 10, 10)
        log(f"filled in {took['dead_s']:.1f}s (dead) + {took['pending_s']:.1f}s (pending); "
            f"Redis used {client.info('memory')['used_memory_human']}")
        dead_id = client.zrange("forq:{big}:dead", 0, 0)[0]
        port = free_port()
        web = subprocess.Popen([sys.executable, "-m", "forq.supervisor.cli", "web", "--redis",
                                server.url(), "--listen", f"127.0.0.1:{port}",
                                # no reuse of a live view's last render: each fetch reads
                                "--refresh", "1ms"], cwd=str(REPO),
                               stdout=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(base + "/static/forq.css", timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or web.poll() is not None:
                        raise RuntimeError("forq web did not start") from None
                    time.sleep(0.1)
            small_job = client.zrange("forq:{small}:dead", 0, 0)[0]
            shared = {"overview": "/", "running now": "/running"}
            per_queue = {
                "pending, first page": ("/queues/big/pending", "/queues/small/pending"),
                "pending, deep page": (f"/queues/big/pending?offset={max(0, args.pending - 50)}",
                                       "/queues/small/pending"),
                "dead, first page": ("/queues/big/dead", "/queues/small/dead"),
                "dead, last page": (f"/queues/big/dead?offset={max(0, args.dead - 50)}",
                                    "/queues/small/dead"),
                "recently finished": ("/queues/big/finished", "/queues/small/finished"),
                "job page": (f"/jobs/big/{dead_id}", f"/jobs/small/{small_job}"),
            }
            paths = list(shared.values()) + [p for pair in per_queue.values() for p in pair]
            measured = fetch_times(base, paths, args.repeat)
            rows = [(label, m, None) for label, m in zip(shared, measured, strict=False)]
            rest = measured[len(shared):]
            rows += [(label, rest[2 * i], rest[2 * i + 1]) for i, label in enumerate(per_queue)]
        finally:
            web.terminate()
            web.wait(timeout=10)
        log("measuring the recently-finished index's cost per job")
        cost = index_cost(client, args.jobs)

    print(f"\nforq web page render, {args.pending:,} pending + {args.dead:,} dead "
          f"(beside a queue of 10 + 10), median / p95 of {args.repeat} fetches:\n")
    print("| page | big queue, ms | small queue, ms | ratio |")
    print("| --- | --- | --- | --- |")
    for label, big, small in rows:
        if small is None:  # the same page whatever the queues: all of them on it
            print(f"| {label} (all queues) | {big['median_ms']} / {big['p95_ms']} | | |")
            continue
        print(f"| {label} | {big['median_ms']} / {big['p95_ms']} | {small['median_ms']} / "
              f"{small['p95_ms']} | {big['median_ms'] / small['median_ms']:.2f}× |")
    print(f"\nrecently-finished index ({cost['jobs']:,} jobs a round, median of "
          f"{cost['rounds']} rounds): Redis-side time of one ack {cost['ack_usec_with_index']} µs "
          f"with it, {cost['ack_usec_without_index']} µs without: {cost['ratio']}×")
    print(f"the index's two commands inside those acks: {cost['index_usec_per_ack']} µs of "
          f"{cost['of_ack_usec']} µs per ack "
          f"({cost['index_usec_per_ack'] / cost['of_ack_usec']:.1%})")
    print(f"Redis commands per ack with it: "
          f"{cost['commands_per_job']['total']:.1f} ({cost['commands_per_job']['top']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
