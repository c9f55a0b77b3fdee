"""forq flow-control benchmark: what the global rate limit costs a claim.

    FORQ_REDIS_URL=redis://127.0.0.1:6379/15 .venv/bin/python bench/flow.py [--quick]

Claim+ack throughput as a supervisor does it, without a supervisor: claim `--batch` jobs
in one script call (lua/claim.lua), then ack them all in one pipeline, through the Queue
API on the Redis at FORQ_REDIS_URL (default redis://127.0.0.1:6379/15). Two queues get
the same backlog; one has a rate limit set far above any rate this loop can reach
(`--rate`, default 10,000,000/s), so the token bucket is read and written on every claim
but never holds a job back (checked: no claim may report a rate wait).

The two queues are drained in alternation, one batch from each in turn (the order
flipping every step), each batch timed on its own: whatever else the machine is doing
falls on both alike, which matters on a shared 2-core box where a round-by-round A/B
is mostly noise. Prints both rates over all rounds, the overhead ratio limited /
unlimited (target >= 0.9) and its spread across rounds. Queues are named
forqbench-flow-*, removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import remove_queue  # noqa: E402
from forq import Queue  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.supervisor.leases.calls import leasing

DEFAULT_URL = "redis://127.0.0.1:6379/15"
OWNER = "bench:flow"
LEASE_MS = 300_000
TARGET_RATIO = 0.9


@dataclass
class Rate:
    jobs: int = 0
    seconds: float = 0.0
    held: int = 0  # claims the rate limit held back

    @property
    def per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0


def fill(q: Queue, n: int, chunk: int = 10_000) -> None:
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        q.enqueue_many({"task": "bench.noop", "args": [start + i, "a short payload"]}
                       for i in range(size))


def claim_ack_batch(q: Queue, batch: int) -> tuple[int, bool]:
    """Claim up to `batch` jobs in one call and ack them in one pipeline.
    Returns (jobs done, whether the claim reported a rate-limit wait)."""
    result = leasing(q).claim(OWNER, batch, LEASE_MS)
    if result.leases:
        pipe = q.redis.pipeline(transaction=False)
        for lease in result.leases:
            leasing(q).ack(lease.id, lease.token, "null", client=pipe)
        replies = pipe.execute()
        assert all(reply == "ok" for reply in replies), replies
    return len(result.leases), result.rate_wait_ms > 0


def measure_round(queues: dict[str, Queue], n: int, batch: int) -> dict[str, Rate]:
    """Drain n jobs from each queue, one batch from each in turn (the order flipping
    every step), timing every batch: both queues see the same moments of the machine."""
    rates = {label: Rate() for label in queues}
    order = list(queues)
    step = 0
    while any(rate.jobs < n for rate in rates.values()):
        for label in order if step % 2 == 0 else order[::-1]:
            rate = rates[label]
            if rate.jobs >= n:
                continue
            t0 = time.perf_counter()
            done, held = claim_ack_batch(queues[label], min(batch, n - rate.jobs))
            rate.seconds += time.perf_counter() - t0
            assert done, (label, rate.jobs, n)
            rate.jobs += done
            rate.held += held
        step += 1
    return rates



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("FORQ_REDIS_URL", DEFAULT_URL))
    parser.add_argument("--quick", action="store_true", help="fewer, smaller rounds")
    parser.add_argument("--batch", type=int, default=100, help="jobs per claim (default 100)")
    parser.add_argument("--rate", type=float, default=10_000_000.0,
                        help="the limit, jobs per second (default 10,000,000: far above)")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when the target is missed (default: report only)")
    args = parser.parse_args(argv)
    rounds = 6 if args.quick else 16
    per_round = 5_000 if args.quick else 10_000

    r = connect(args.url)
    tag = uuid.uuid4().hex[:8]
    queues = {"free": Queue(f"forqbench-flow-{tag}-free", redis=r),
              "limited": Queue(f"forqbench-flow-{tag}-limited", redis=r)}
    queues["limited"].set_limits(rate=(args.rate, 1.0))
    print(f"forq flow benchmark on Redis {r.info('server')['redis_version']} at {args.url}: "
          f"{rounds} rounds x {per_round:,} jobs per queue, claims of {args.batch}, "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}", file=sys.stderr)
    rounds_done: list[dict[str, Rate]] = []
    try:
        for q in queues.values():  # warm up: load the scripts, create the bucket
            fill(q, 2 * args.batch)
        measure_round(queues, 2 * args.batch, args.batch)
        assert r.hget(queues["limited"].keys.bucket, "ts"), "the rate limit is not in play"
        for _ in range(rounds):
            for q in queues.values():
                fill(q, per_round)
            rounds_done.append(measure_round(queues, per_round, args.batch))
    finally:
        for q in queues.values():
            remove_queue(r, q.name)

    def total(label: str) -> Rate:
        out = Rate()
        for rates in rounds_done:
            out.jobs += rates[label].jobs
            out.seconds += rates[label].seconds
            out.held += rates[label].held
        return out

    free, limited = total("free"), total("limited")
    per_round_ratios = [rates["limited"].per_s / rates["free"].per_s for rates in rounds_done]
    ratio = limited.per_s / free.per_s if free.per_s else 0.0
    ok = ratio >= TARGET_RATIO and limited.held == 0
    print(f"{'claim+ack (batched claim, pipelined ack)':<40} {'jobs/s':>10}")
    print(f"{'  without a rate limit':<40} {free.per_s:>10,.0f}")
    print(f"{f'  with rate_limit {args.rate:,.0f}/s':<40} {limited.per_s:>10,.0f}")
    print(f"overhead ratio (with / without): {ratio:.3f}  target >= {TARGET_RATIO}  "
          f"{'PASS' if ok else 'MISS'}")
    print(f"  per round: median {statistics.median(per_round_ratios):.3f}, "
          f"min {min(per_round_ratios):.3f}, max {max(per_round_ratios):.3f}")
    print(f"claims held back by the limit: {limited.held} (must be 0: the limit is far "
          f"above the rate)")
    if limited.held:
        print("the limit was reached: raise --rate", file=sys.stderr)
    return 1 if args.strict and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
