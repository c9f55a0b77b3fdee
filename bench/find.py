"""Finding jobs: what a walk of a big dead set costs with lua/find.lua, beside the same
walk done by the client (ZRANGE a page, HMGET each job's fields, filter in Python), in
one run on one private Redis.

    .venv/bin/python -m bench.find                    # 200,000 dead jobs
    .venv/bin/python -m bench.find --jobs 50000

The dead set is filled with records written directly (as fail.lua leaves them: task,
state, dead_reason, error JSON, args), 1 in 1,000 of a rare task. Then:

* ``find, rare task``: `Queue.find_iter("dead", task=RARE)` walks the whole set (many
  pages of at most 20 calls of 1,000 entries): wall time, entries/s, Redis CPU per entry
  examined, and the longest single script call (what one call blocks Redis for);
* ``client walk``: the baseline, ZRANGE 1,000 ids + one pipelined HMGET of the same
  fields per page, filtered in Python;
* ``find, error regex``: the whole set again with an error pattern matched by the client
  on the pages' candidates;
* ``first page``: `find("dead", count=50)` with no filter, the dashboard's first page.
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

from bench.common import RedisServer, log, redis_cpu_seconds  # noqa: E402
from forq import Queue  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.store.finder import FIELDS  # noqa: E402

RARE = "reports.rare"


def fill(q: Queue, n: int) -> None:
    pipe = q.redis.pipeline(transaction=False)
    for i in range(n):
        job_id = f"d{i:08d}"
        task = RARE if i % 1000 == 7 else "emails.send"
        error = json.dumps({"type": "TimeoutError" if i % 3 else "ValueError",
                            "message": f"upstream {i % 17} timed out", "traceback": "x" * 400})
        pipe.hset(q.keys.job(job_id), mapping={
            "id": job_id, "queue": q.name, "task": task, "state": "dead", "attempts": 3,
            "crashes": 0, "dead_reason": "attempts exhausted: 3", "error": error,
            "args": json.dumps([f"user{i}@example.com"]), "kwargs": "{}",
            "finished_at": 1_700_000_000_000 + i, "enqueued_at": 1_700_000_000_000})
        pipe.zadd(q.keys.dead, {job_id: 1_700_000_000_000 + i})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def slowlog_max_us(client: Any) -> int:
    """The longest EVALSHA in the slow log (every command is logged: threshold 0)."""
    entries = client.slowlog_get(128)
    return max((int(e["duration"]) for e in entries
                if str(e.get("command", b"")).upper().startswith(("EVALSHA", "B'EVALSHA"))),
               default=0)


def timed(client: Any, run: Any) -> tuple[float, float, Any]:
    cpu0, t0 = redis_cpu_seconds(client), time.perf_counter()
    out = run()
    return time.perf_counter() - t0, redis_cpu_seconds(client) - cpu0, out


def client_walk(q: Queue, page: int = 1000) -> int:
    found, start = 0, 0
    while True:
        ids = q.redis.zrange(q.keys.dead, start, start + page - 1)
        if not ids:
            return found
        pipe = q.redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(q.keys.job(job_id), *FIELDS)
        found += sum(1 for f in pipe.execute() if f[0] == RARE)
        start += page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    args = parser.parse_args(argv)
    with RedisServer() as server:
        client = connect(server.url())
        q = Queue("bf" + uuid.uuid4().hex[:8], redis=client)
        log(f"find: filling {args.jobs:,} dead jobs")
        fill(q, args.jobs)
        results: dict[str, Any] = {"jobs": args.jobs}

        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 128)
        client.slowlog_reset()
        wall, cpu, found = timed(client, lambda: sum(1 for _ in q.find_iter("dead", task=RARE)))
        longest = slowlog_max_us(client)
        results["find_rare_task"] = {"found": found, "wall_s": round(wall, 3),
                                     "entries_per_s": round(args.jobs / wall),
                                     "redis_cpu_us_per_entry": round(cpu / args.jobs * 1e6, 3),
                                     "longest_call_ms": round(longest / 1000, 2)}
        wall_c, cpu_c, found_c = timed(client, lambda: client_walk(q))
        results["client_walk"] = {"found": found_c, "wall_s": round(wall_c, 3),
                                  "entries_per_s": round(args.jobs / wall_c),
                                  "redis_cpu_us_per_entry": round(cpu_c / args.jobs * 1e6, 3)}
        results["find_vs_client_walk_wall"] = round(wall / wall_c, 2)
        wall_e, cpu_e, found_e = timed(client, lambda: sum(
            1 for _ in q.find_iter("dead", error=r"^ValueError: upstream 1\d? ")))
        results["find_error_regex"] = {"found": found_e, "wall_s": round(wall_e, 3),
                                       "entries_per_s": round(args.jobs / wall_e)}
        wall_p, _, page = timed(client, lambda: q.find("dead", count=50))
        results["first_page_ms"] = round(wall_p * 1000, 2)
        assert found == found_c == len(range(7, args.jobs, 1000)) and len(page.jobs) == 50
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
