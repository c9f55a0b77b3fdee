"""Groups (per-key concurrency): what they cost the claim, and what they add to the plain
path, side by side in one run on one private Redis.

    .venv/bin/python -m bench.groups                      # 1,000,000 jobs (a few minutes)
    .venv/bin/python -m bench.groups --jobs 200000 --groups 100000 --measure 20000

Each scenario fills a queue with `--jobs` no-op jobs (enqueue_many), then drains
`--measure` of them from the top through the public lease API, one client, as
bench/scale.py does: *claim 100* claims 100 and pipelines their acks, *claim 1* is one
claim and one ack per job. The scenarios compared hold their backlogs at once and are
drained in turn, `--reps` rounds (medians), so this shared machine's load falls on each
alike. Per job over the claim-100 drain: Redis commands (INFO commandstats, those run
inside the scripts included) and the µs Redis spent in scripts (EVALSHA's usec), the
figure least moved by the client's scheduling.

* ``plain, before groups``: ungrouped jobs through the scripts of the commit before
  groups landed (read from git), the baseline the plain path must not fall behind;
* ``plain``: ungrouped jobs through this checkout's scripts;
* ``1 group``: every job in one group, group_concurrency = 1,000,000 (claims of 100);
* ``1 group, concurrency 1``: the same group at its default limit (one job per claim);
* ``N groups``: jobs spread round-robin over `--groups` groups, group_concurrency 1,
  so each claim of 100 takes the heads of 100 different groups from the ready set.

The claim cost must not depend on the number of groups: ``N groups`` against ``1 group``
is the ratio that says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RedisServer,
    command_calls,
    commands_per_job,
    enqueue_noops,
    log,
    median,
    scripts_at,
)
from forq import Queue  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.supervisor.leases.calls import leasing

OWNER = "bench-groups:1"
LEASE_MS = 600_000
# the last commit before lua/_groups.lua (groups landed in the commit that added it)
BEFORE_GROUPS = "d5eba77"


def before_groups_scripts(client: Any) -> dict[str, Any] | None:
    """enqueue, claim and ack as they were before groups (None without git history)."""
    return scripts_at(client, BEFORE_GROUPS)


def fill(q: Queue, n: int, groups: int | None) -> float:
    """n jobs by enqueue_many (grouped round-robin over `groups`); returns jobs/s."""
    return enqueue_noops(q, n, (lambda i: {"group": f"customer-{i % groups}"}) if groups
                         else None)


def drain(q: Queue, n: int, batch: int) -> float:
    """Claim and ack n jobs, `batch` per claim (acks pipelined); returns jobs/s."""
    t0 = time.perf_counter()
    done = 0
    while done < n:
        leases = leasing(q).claim(OWNER, min(batch, n - done), LEASE_MS).leases
        if not leases:
            raise RuntimeError(f"{q.name}: nothing claimable after {done} jobs")
        if len(leases) == 1:
            assert leasing(q).ack(leases[0].id, leases[0].token, "null") == "ok"
        else:
            pipe = q.redis.pipeline(transaction=False)
            for lease in leases:
                leasing(q).ack(lease.id, lease.token, "null", client=pipe)
            pipe.execute()
        done += len(leases)
    return n / (time.perf_counter() - t0)


class Scenario:
    """One queue and its backlog: how it was filled, and its drains' figures."""

    def __init__(self, client: Any, name: str, jobs: int, groups: int | None = None,
                 concurrency: int | None = None, before: bool = False) -> None:
        self.client, self.name, self.jobs, self.groups = client, name, jobs, groups
        self.q = Queue("bg" + uuid.uuid4().hex[:8], redis=client)
        self.skipped = ""
        if before:
            old = before_groups_scripts(client)
            if old is None:
                self.skipped = "no git history to read the old scripts from"
                return
            self.q.scripts._by_name.update(old)  # type: ignore[arg-type]
        if concurrency is not None:
            self.q.set_limits(group_concurrency=concurrency)
        log(f"groups: {name}: filling {jobs:,} jobs")
        used = int(client.info("memory")["used_memory"])
        self.enqueue_rate = fill(self.q, jobs, groups)
        self.bytes_per_job = (int(client.info("memory")["used_memory"]) - used) / jobs
        self.batch: list[float] = []
        self.single: list[float] = []
        self.script_us: list[float] = []
        self.per_job: dict[str, Any] = {}

    def drain(self, measure: int, single: int) -> None:
        """Claim 100 + acks over `measure` jobs (with the Redis commands and the time
        Redis spent in scripts, per job), then claim 1 + ack over `single`."""
        if self.skipped:
            return
        calls0 = command_calls(self.client)
        usec0 = script_usec(self.client)
        self.batch.append(drain(self.q, measure, 100))
        self.script_us.append((script_usec(self.client) - usec0) / measure)
        self.per_job = commands_per_job(calls0, command_calls(self.client), measure)
        self.single.append(drain(self.q, single, 1))

    def row(self) -> dict[str, Any]:
        if self.skipped:
            return {"name": self.name, "skipped": self.skipped}
        return {"name": self.name, "jobs": self.jobs, "groups": self.groups,
                "enqueue_per_s": self.enqueue_rate, "claim100_per_s": median(self.batch),
                "claim1_per_s": median(self.single),
                "script_us_per_job": median(self.script_us),
                "commands_per_job": self.per_job["total"], "top": self.per_job["top"],
                "redis_bytes_per_job": self.bytes_per_job}


def script_usec(client: Any) -> int:
    """Microseconds Redis has spent running scripts by EVALSHA (INFO commandstats)."""
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))


def compare(pair: list[Scenario], measure: int, single: int,
            reps: int) -> list[dict[str, Any]]:
    """Drain the scenarios' backlogs in turn, `reps` rounds, so load on this shared
    machine falls on each alike."""
    for i in range(reps):
        log(f"groups: round {i + 1}/{reps}: " + ", ".join(s.name for s in pair))
        for s in pair:
            s.drain(measure, single)
    return [s.row() for s in pair]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000, help="backlog per scenario")
    parser.add_argument("--groups", type=int, default=100_000, help="groups in 'N groups'")
    parser.add_argument("--measure", type=int, default=30_000,
                        help="jobs drained by claims of 100")
    parser.add_argument("--single", type=int, default=3_000, help="jobs drained one a claim")
    parser.add_argument("--reps", type=int, default=3, help="drains per backlog (medians)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with RedisServer() as server:
        # a database per comparison, never flushed: a big backlog's FLUSHDB outlasts a
        # socket timeout, and its memory must not be freed under the next one's fill
        first, second, third = (connect(server.url(db)) for db in (0, 1, 2))
        n, m, k, reps = args.jobs, args.measure, args.single, args.reps
        rows += compare([Scenario(first, "plain, before groups", n, before=True),
                         Scenario(first, "plain", n)], m, k, reps)
        rows += compare([Scenario(second, "1 group", n, 1, concurrency=1_000_000),
                         Scenario(second, f"{args.groups:,} groups", n, args.groups)],
                        m, k, reps)
        # one job per claim: a smaller backlog will do, the claim is O(log n) in it
        rows += compare([Scenario(third, "1 group, concurrency 1", 2 * k * reps, 1)],
                        k, k, reps)
    one = next(r for r in rows if r["name"] == "1 group")
    print(f"\n{args.jobs:,} jobs per scenario; claim 100 over {args.measure:,}, "
          f"claim 1 over {args.single:,}; {args.reps} rounds; load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| scenario | enqueue_many, jobs/s | claim 100 + acks, jobs/s | ÷ 1 group "
          "| claim 1 + ack, jobs/s | Redis commands per job (claim 100) "
          "| µs in scripts per job (claim 100) | bytes per job |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['name']} | skipped: {r['skipped']} | | | | | | |")
            continue
        ratio = r["claim100_per_s"] / one["claim100_per_s"]
        print(f"| {r['name']} | {r['enqueue_per_s']:,.0f} | {r['claim100_per_s']:,.0f} | "
              f"{ratio:.2f} | {r['claim1_per_s']:,.0f} | {r['commands_per_job']:.2f} | "
              f"{r['script_us_per_job']:.1f} | {r['redis_bytes_per_job']:,.0f} |")
    print()
    for r in rows:
        if "top" in r:
            print(f"- {r['name']}: {json.dumps(r['top'])}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
