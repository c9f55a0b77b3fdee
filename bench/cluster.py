"""forq on Redis Cluster: total jobs/s with 1 shard vs 3 shards.

    .venv/bin/python bench/cluster.py [--quick] [--procs 4] [--queues 12] [--jobs 20000]

For each shard count it starts a private local cluster (``redis-server
--cluster-enabled yes`` on free ports; one node holding every slot, or three joined with
``redis-cli --cluster create``), picks queue names spread evenly over the shards, and
runs several client processes at once. Each process owns some queues and runs, per
round: ``enqueue_many`` of a batch into each of its queues, then claim+ack loops (one
cross-shard pipeline claims 100 from each of its queues, one pipeline acks them all)
until its queues are empty. A job counts once it is acked.

Two figures per run:

* **measured** — total acked jobs / wall time, everything on this machine. Clients and
  shards share its cores, so on a 2-core box this cannot scale with shards.
* **Redis-side capacity** — jobs / the busiest shard's CPU seconds (each node's
  ``used_cpu_sys_main_thread + used_cpu_user_main_thread``). That is the rate the
  cluster could sustain if every shard had its own core and the clients kept up: the
  Redis side of the scaling, which is what adding shards buys.

The ratios 3 shards / 1 shard of both are printed; with queues spread evenly the
Redis-side ratio should be near 3 (near-linear).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis.crc import key_slot  # noqa: E402

from forq import Queue  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.supervisor.leases.calls import leasing
from tests.cluster_server import LocalCluster  # noqa: E402

OWNER = "bench-cluster:1"
LEASE_MS = 300_000
CLAIM = 100


def spread_names(cluster: LocalCluster, count: int, tag: str) -> list[str]:
    """`count` queue names, as evenly spread over the cluster's nodes as possible."""
    per_node: dict[int, list[str]] = {n.port: [] for n in cluster.nodes}
    want = -(-count // len(per_node))
    i = 0
    while sum(len(v) for v in per_node.values()) < count:
        name = f"cb-{tag}-{i}"
        i += 1
        names = per_node[cluster.node_for_slot(key_slot(name.encode())).port]
        if len(names) < want:
            names.append(name)
    # interleave so each process gets queues on different shards
    columns = list(per_node.values())
    return [col[j] for j in range(want) for col in columns if j < len(col)][:count]


def worker(url: str, names: list[str], jobs: int, batch: int, start_at: float,
           out: mp.Queue) -> None:
    client = connect(url)
    queues = [Queue(name, redis=client) for name in names]
    while time.time() < start_at:
        time.sleep(0.001)
    began = time.perf_counter()
    done = 0
    per_round = batch * len(queues)
    while done < jobs:
        for q in queues:
            q.enqueue_many([{"task": "bench.noop", "args": [i]} for i in range(batch)])
        left = per_round
        while left > 0:
            pipe = client.pipeline(transaction=False)
            for q in queues:
                leasing(q).claim(OWNER, CLAIM, LEASE_MS, client=pipe)
            claims = [leasing(q).parse_claim(reply) for q, reply in zip(queues, pipe.execute(), strict=True)]
            pipe = client.pipeline(transaction=False)
            acked = 0
            for q, claim in zip(queues, claims, strict=True):
                for lease in claim.leases:
                    leasing(q).ack(lease.id, lease.token, "null", client=pipe)
                    acked += 1
            if not acked:
                break
            pipe.execute()
            left -= acked
            done += acked
    out.put((done, time.perf_counter() - began))


def node_cpu(cluster: LocalCluster) -> dict[int, float]:
    cpu = {}
    for node in cluster.nodes:
        info = node.client().info("cpu")
        cpu[node.port] = float(info["used_cpu_sys_main_thread"]) + float(
            info["used_cpu_user_main_thread"])
    return cpu


def run(shards: int, procs: int, queues: int, jobs: int, batch: int) -> dict:
    with LocalCluster(shards) as cluster:
        tag = uuid.uuid4().hex[:6]
        names = spread_names(cluster, queues, tag)
        per_proc = [names[i::procs] for i in range(procs)]
        # warm up: load the scripts on every shard, and the slot map
        warm = connect(cluster.url)
        for name in names:
            Queue(name, redis=warm).enqueue_many([{"task": "bench.noop"}])
            leasing(Queue(name, redis=warm)).claim(OWNER, 10, LEASE_MS)
        before = node_cpu(cluster)
        out: mp.Queue = mp.get_context("fork").Queue()
        start_at = time.time() + 1.0
        workers = [mp.get_context("fork").Process(
            target=worker, args=(cluster.url, mine, jobs, batch, start_at, out))
            for mine in per_proc if mine]
        for w in workers:
            w.start()
        results = [out.get(timeout=600) for _ in workers]
        for w in workers:
            w.join(timeout=30)
        after = node_cpu(cluster)
        total = sum(done for done, _ in results)
        wall = max(seconds for _, seconds in results)
        busy = {port: after[port] - before[port] for port in after}
        busiest = max(busy.values())
        return {
            "shards": shards, "procs": len(workers), "queues": len(names), "jobs": total,
            "seconds": wall, "jobs_per_s": total / wall,
            "shard_cpu_s": sorted(busy.values(), reverse=True),
            "redis_capacity_jobs_per_s": total / busiest if busiest else 0.0,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs per process")
    parser.add_argument("--procs", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--queues", type=int, default=12, help="queues (default 12)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="jobs per process (default 20,000; 5,000 with --quick)")
    parser.add_argument("--batch", type=int, default=500,
                        help="jobs per queue per enqueue_many (default 500)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args(argv)
    jobs = args.jobs or (5_000 if args.quick else 20_000)

    print(f"forq cluster benchmark: {args.procs} client processes, {args.queues} queues, "
          f"{jobs:,} jobs per process, on {os.cpu_count()} CPU(s)", file=sys.stderr)
    rows = []
    for shards in (1, 3):
        print(f"  {shards} shard(s) ...", file=sys.stderr)
        rows.append(run(shards, args.procs, args.queues, jobs, args.batch))
    one, three = rows
    measured = three["jobs_per_s"] / one["jobs_per_s"]
    capacity = three["redis_capacity_jobs_per_s"] / one["redis_capacity_jobs_per_s"]
    print(f"\n{'shards':>6} {'jobs':>9} {'seconds':>8} {'jobs/s':>9} "
          f"{'shard CPU s':>20} {'Redis-side jobs/s':>18}")
    for row in rows:
        cpu = "/".join(f"{c:.1f}" for c in row["shard_cpu_s"])
        print(f"{row['shards']:>6} {row['jobs']:>9,} {row['seconds']:>8.2f} "
              f"{row['jobs_per_s']:>9,.0f} {cpu:>20} {row['redis_capacity_jobs_per_s']:>18,.0f}")
    print(f"\n3 shards / 1 shard: measured {measured:.2f}x (all on {os.cpu_count()} cores), "
          f"Redis-side capacity {capacity:.2f}x")
    if args.json:
        print(json.dumps({"runs": rows, "ratio_measured": measured,
                          "ratio_redis_side": capacity}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
