"""forq core benchmark: enqueue and claim+ack throughput against `redis-benchmark`.

    FORQ_REDIS_URL=redis://127.0.0.1:6379/15 .venv/bin/python bench/core.py [--quick]

What it measures, on the Redis at FORQ_REDIS_URL (default redis://127.0.0.1:6379/15):

* LPUSH with `redis-benchmark -t lpush` in the same run, as the yardstick for this
  machine and this Redis: 50 clients (its default), 1 client, and 1 client pipelining.
* single `Queue.enqueue` (one round trip per job) and `Queue.enqueue_many` (the whole
  batch in one pipeline of 500-job script calls), each printed beside LPUSH.
* claim+ack as a supervisor does it, batched: claim 100 jobs in one script call, then
  ack all 100 in one pipeline; at a backlog of 1,000 and of 1,000,000 (the big backlog
  is built with enqueue_many, which is the enqueue_many measure), and their ratio: a
  claim must cost O(log n), so the big backlog may not be much slower.

Every rate is measured in segments, and the figure judged is the median segment's
rate (the overall rate is printed beside it): these machines are shared, and a burst
of someone else's load should not decide a target. The two claim+ack backlogs are
measured in alternating rounds on the same server, so their ratio compares like with
like. The machine's load average is printed at the start and the end.

For each rate it also prints where the time goes: this process's CPU per job (building
arguments, parsing replies) and Redis's own time per job (EVALSHA usec from INFO
commandstats; other clients of the same Redis add noise there). `--profile` adds a
cProfile of the claim+ack loop.

Targets: enqueue_many >= 40,000 jobs/s; claim+ack >= 10,000 jobs/s; claim+ack at the
big backlog >= 0.8 x at 1,000. Queues are named forqbench-*, and removed afterwards.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import remove_queue  # noqa: E402
from forq import Queue  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.supervisor.leases.calls import leasing

DEFAULT_URL = "redis://127.0.0.1:6379/15"
OWNER = "bench:1"
LEASE_MS = 300_000

TARGET_ENQUEUE_MANY = 40_000
TARGET_CLAIM_ACK = 10_000
TARGET_SCALE_RATIO = 0.8


@dataclass
class Rate:
    """Jobs over time, summed over segments; `median` is the median segment's rate,
    the figure judged against the targets (robust to other load on a shared machine)."""

    jobs: int = 0
    seconds: float = 0.0
    cpu: float = 0.0  # this process's CPU seconds
    server_us: float = 0.0  # Redis EVALSHA microseconds
    segments: list[float] = field(default_factory=list)  # jobs/s of each segment
    extra: dict = field(default_factory=dict)

    @property
    def per_s(self) -> float:
        """Overall: all jobs over all (timed) seconds."""
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.segments) if self.segments else self.per_s

    @property
    def best(self) -> float:
        return max(self.segments) if self.segments else self.per_s

    def add(self, jobs: int, meter: Meter) -> None:
        self.jobs += jobs
        self.seconds += meter.seconds
        self.cpu += meter.cpu
        self.server_us += meter.server_us
        self.segments.append(jobs / meter.seconds if meter.seconds > 0 else 0.0)

    def breakdown(self) -> str:
        wall = self.seconds / self.jobs * 1e6
        return (f"{wall:6.1f} us/job wall = {self.cpu / self.jobs * 1e6:5.1f} client CPU"
                f" + {self.server_us / self.jobs:5.1f} Redis script")


class Meter:
    """Wall time, this process's CPU time and Redis's EVALSHA time across a block."""

    def __init__(self, r) -> None:
        self.r = r

    def _script_usec(self) -> float:
        stats = self.r.info("commandstats")
        return float(sum(v.get("usec", 0) for k, v in stats.items()
                         if k in ("cmdstat_evalsha", "cmdstat_eval")))

    def __enter__(self) -> Meter:
        self.usec0 = self._script_usec()
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.cpu0
        self.server_us = self._script_usec() - self.usec0


# -- the yardstick --------------------------------------------------------------------


def lpush_rate(url: str, requests: int, clients: int = 50, pipeline: int = 1) -> float | None:
    """LPUSH requests/s from redis-benchmark on the same server, or None without it."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    u = urlparse(url)
    db = (u.path or "/0").lstrip("/") or "0"
    cmd = [binary, "-h", u.hostname or "127.0.0.1", "-p", str(u.port or 6379),
           "--dbnum", db, "-t", "lpush", "-n", str(requests), "-c", str(clients),
           "-P", str(pipeline), "--csv"]
    password = unquote(u.password) if u.password else os.environ.get("FORQ_REDIS_PASSWORD")
    env = dict(os.environ)
    if password:
        env["REDISCLI_AUTH"] = password
        if u.username:
            cmd += ["--user", unquote(u.username), "-a", password]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env,
                          check=False)
    for line in proc.stdout.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if cells and cells[0] == "LPUSH":
            return float(cells[1])
    print(f"redis-benchmark gave no LPUSH figure:\n{proc.stdout}\n{proc.stderr}",
          file=sys.stderr)
    return None


# -- the measures ---------------------------------------------------------------------


def job_spec(i: int) -> dict:
    return {"task": "bench.noop", "args": [i, "a short payload, like an email address"]}


def measure_single_enqueue(q: Queue, n: int, segment: int = 500) -> Rate:
    q.enqueue("bench.warmup")  # load the script, register the queue
    rate = Rate()
    for start in range(0, n, segment):
        size = min(segment, n - start)
        with Meter(q.redis) as m:
            for i in range(start, start + size):
                q.enqueue("bench.noop", i, "a short payload, like an email address")
        rate.add(size, m)
    return rate


def fill(q: Queue, n: int, chunk: int, rate: Rate | None = None, progress: bool = False) -> None:
    """Enqueue n jobs with enqueue_many, `chunk` jobs per call, timing each call into
    `rate`. Only the count is kept: a million Job handles would weigh on the client."""
    done = 0
    while done < n:
        size = min(chunk, n - done)
        specs = [job_spec(done + i) for i in range(size)]
        with Meter(q.redis) as m:
            handles = q.enqueue_many(specs)
        assert len(handles) == size
        if rate is not None:
            rate.add(size, m)
        done += size
        if progress and rate is not None and n >= 200_000 and done % 200_000 == 0:
            print(f"  ... {done:,} enqueued ({rate.per_s:,.0f} jobs/s)", file=sys.stderr)


def claim_ack(q: Queue, n: int, batch: int) -> int:
    """Claim up to n jobs `batch` at a time, acking each batch in one pipeline."""
    done = 0
    while done < n:
        result = leasing(q).claim(OWNER, min(batch, n - done), LEASE_MS)
        if not result.leases:
            break
        pipe = q.redis.pipeline(transaction=False)
        for lease in result.leases:
            leasing(q).ack(lease.id, lease.token, "null", client=pipe)
        replies = pipe.execute()
        assert all(reply == "ok" for reply in replies), replies
        done += len(result.leases)
    return done


def measure_claim_ack(small: Queue, big: Queue, rounds: int, per_round: int, batch: int,
                      profile: bool) -> tuple[Rate, Rate]:
    """Alternate rounds: refill `small` to 1,000 and drain it; then claim+ack `per_round`
    jobs off the big backlog (which stays near its size). Both timed per round."""
    at_small, at_big = Rate(), Rate()
    profiler = cProfile.Profile() if profile else None
    for _ in range(rounds):
        fill(small, 1_000, 1_000)
        with Meter(small.redis) as m:
            done = claim_ack(small, 1_000, batch)
        assert done == 1_000, done
        at_small.add(done, m)
        with Meter(big.redis) as m:
            if profiler:
                profiler.enable()
            done = claim_ack(big, per_round, batch)
            if profiler:
                profiler.disable()
        assert done == per_round, done
        at_big.add(done, m)
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
        at_big.extra["profile"] = out.getvalue()
    return at_small, at_big


# -- report ------------------------------------------------------------------------------


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def ratio(a: float, b: float | None) -> str:
    return "n/a" if not b else f"{a / b:.2f}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller run: a 100,000-job big backlog instead of 1,000,000")
    parser.add_argument("--url", default=os.environ.get("FORQ_REDIS_URL", DEFAULT_URL))
    parser.add_argument("--batch", type=int, default=100, help="jobs per claim (default 100)")
    parser.add_argument("--profile", action="store_true",
                        help="print a cProfile of the claim+ack loop at the big backlog")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a target is missed (default: report only)")
    args = parser.parse_args(argv)

    big_n = 100_000 if args.quick else 1_000_000
    single_n = 3_000 if args.quick else 10_000
    rounds = 8 if args.quick else 20
    lpush_n = 50_000 if args.quick else 200_000
    chunk = 20_000 if args.quick else 50_000  # jobs per enqueue_many call

    r = connect(args.url)
    version = r.info("server")["redis_version"]
    tag = uuid.uuid4().hex[:8]
    names = {k: f"forqbench-{tag}-{k}" for k in ("single", "small", "big")}
    mode = "quick" if args.quick else "full"
    load_start = load()
    print(f"forq core benchmark ({mode} run) on Redis {version} at {args.url}",
          file=sys.stderr)

    try:
        print("measuring LPUSH with redis-benchmark ...", file=sys.stderr)
        lpush50 = lpush_rate(args.url, lpush_n)
        lpush1 = lpush_rate(args.url, lpush_n // 4, clients=1)
        lpush1p = lpush_rate(args.url, lpush_n, clients=1, pipeline=500)
        r.delete("mylist")  # redis-benchmark's key

        print(f"single enqueue x {single_n:,} ...", file=sys.stderr)
        single = measure_single_enqueue(Queue(names["single"], redis=r), single_n)
        remove_queue(r, names["single"])

        print(f"enqueue_many: building a backlog of {big_n:,} ...", file=sys.stderr)
        big = Queue(names["big"], redis=r)
        many = Rate()
        fill(big, big_n, chunk, many, progress=True)
        assert r.zcard(big.keys.pending) == big_n

        print(f"claim+ack: {rounds} rounds at backlogs 1,000 and {big_n:,} ...",
              file=sys.stderr)
        small_rate, big_rate = measure_claim_ack(Queue(names["small"], redis=r), big,
                                                 rounds, 1_000, args.batch, args.profile)
    finally:
        print("cleaning up ...", file=sys.stderr)
        for name in names.values():
            remove_queue(r, name)

    scale = big_rate.median / small_rate.median if small_rate.median else 0.0
    checks = {
        "enqueue_many": many.median >= TARGET_ENQUEUE_MANY,
        "claim+ack small": small_rate.median >= TARGET_CLAIM_ACK,
        "claim+ack big": big_rate.median >= TARGET_CLAIM_ACK,
        "scale": scale >= TARGET_SCALE_RATIO,
    }
    rows = [
        ("redis-benchmark LPUSH, 50 clients", lpush50, None, "", "", "", ""),
        ("redis-benchmark LPUSH, 1 client", lpush1, None, "", "", "", ""),
        ("redis-benchmark LPUSH, 1 client -P 500", lpush1p, None, "", "", "", ""),
        ("enqueue (one call per job)", single.median, single,
         ratio(single.median, lpush50), ratio(single.median, lpush1), "", ""),
        (f"enqueue_many ({chunk:,} per call)", many.median, many,
         ratio(many.median, lpush50), ratio(many.median, lpush1p),
         f">= {TARGET_ENQUEUE_MANY:,}", verdict(checks["enqueue_many"])),
        (f"claim+ack, backlog 1,000 (claim {args.batch})", small_rate.median,
         small_rate, "", "", f">= {TARGET_CLAIM_ACK:,}",
         verdict(checks["claim+ack small"])),
        (f"claim+ack, backlog {big_n:,} (claim {args.batch})", big_rate.median,
         big_rate, "", "", f">= {TARGET_CLAIM_ACK:,}",
         verdict(checks["claim+ack big"])),
    ]
    print()
    print(f"forq core benchmark, {mode} run, Redis {version}, "
          f"load average {load_start} at start, {load()} at end")
    header = (f"{'measure':<44} {'jobs/s':>10} {'overall':>9} {'best':>9} {'/LPUSH-50':>10} "
              f"{'/LPUSH-1':>9} {'target':>10} {'result':>6}")
    print(header)
    print("-" * len(header))
    for name, value, rate, r50, r1, target, result in rows:
        overall = fmt(rate.per_s) if rate else ""
        best = fmt(rate.best) if rate else ""
        print(f"{name:<44} {fmt(value):>10} {overall:>9} {best:>9} "
              f"{r50:>10} {r1:>9} {target:>10} {result:>6}")
    print(f"{'claim+ack ratio, backlog ' + format(big_n, ',') + ' / 1,000':<44} "
          f"{scale:>10.2f} {'':>9} {'':>9} {'':>10} {'':>9} "
          f"{'>= ' + str(TARGET_SCALE_RATIO):>10} {verdict(checks['scale']):>6}")
    print("jobs/s: median segment (judged); overall: all jobs / all timed seconds; best: "
          "fastest segment.\n/LPUSH-1: single enqueue vs 1-client LPUSH, enqueue_many vs "
          "1-client LPUSH -P 500.")
    print()
    print("where the time goes (client CPU: this process; Redis script: EVALSHA usec, "
          "shared server; the rest is waiting: round trips, other load)")
    for name, rate in (("enqueue", single), ("enqueue_many", many),
                       ("claim+ack 1,000", small_rate), (f"claim+ack {big_n:,}", big_rate)):
        print(f"  {name:<20} {rate.breakdown()}")
    if "profile" in big_rate.extra:
        print()
        print(big_rate.extra["profile"])
    missed = [name for name, ok in checks.items() if not ok]
    print()
    print("overall:", f"MISS ({', '.join(missed)})" if missed else "PASS")
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
