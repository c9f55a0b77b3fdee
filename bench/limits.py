"""The machine's own limits, measured in the same run as everything else: redis-benchmark
LPUSH and EVALSHA (50 clients, and 1 client: one round trip at a time, as one
supervisor talks to Redis), and the raw fork rate (see bench/forkrate.py)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import redis

from bench.common import median

LPUSH_SCRIPT = "return redis.call('LPUSH', KEYS[1], ARGV[1])"


def redis_benchmark(port: int, args: list[str], requests: int, clients: int,
                    pipeline: int = 1) -> float | None:
    """Requests/s reported by redis-benchmark for one test (CSV output)."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    cmd = [binary, "-h", "127.0.0.1", "-p", str(port), "-n", str(requests), "-c", str(clients),
           "-P", str(pipeline), "--csv", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False).stdout
    for line in out.splitlines()[1:]:
        cells = [c.strip('"') for c in line.split(",")]
        if len(cells) > 1:
            try:
                return float(cells[1])
            except ValueError:
                continue
    return None


def measure(port: int, quick: bool = False) -> dict[str, Any]:
    reps = 2 if quick else 3
    n = 50_000 if quick else 100_000
    n1 = n // 5
    r = redis.Redis(port=port, db=0)
    sha = r.script_load(LPUSH_SCRIPT)
    cases = {
        "LPUSH, 50 clients": (["-t", "lpush"], n, 50),
        "LPUSH, 1 client": (["-t", "lpush"], n1, 1),
        "EVALSHA (an LPUSH script), 50 clients": (["EVALSHA", sha, "1", "benchlist", "x"], n, 50),
        "EVALSHA (an LPUSH script), 1 client": (["EVALSHA", sha, "1", "benchlist", "x"], n1, 1),
    }
    out: dict[str, Any] = {}
    for name, (args, requests, clients) in cases.items():
        runs = [redis_benchmark(port, args, requests, clients) for _ in range(reps)]
        out[name] = {"median": median(runs), "runs": runs, "requests": requests}
    r.delete("mylist", "benchlist")  # redis-benchmark's keys
    return out
