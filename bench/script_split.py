"""Where Redis spends a job's time inside forq's lease scripts: in the commands they run,
or in Lua around them (building tables and strings, converting replies).

    .venv/bin/python -m bench.script_split                  # 20,000 jobs, 50 a call, 2 rounds
    .venv/bin/python -m bench.script_split --jobs 5000 --batch 1

On one private Redis, mail jobs (the ceiling's payload) are enqueued, then claimed,
extended and acked `--batch` at a time as a supervisor's calls are, one script at a
time. INFO commandstats with `usec` is read around each phase: EVALSHA's time includes
the commands the script ran, which commandstats also counts on their own, so EVALSHA's
µs less theirs is the Lua itself (Findings XIV: 58% of a ceiling job's script time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ceiling import _policy  # noqa: E402
from bench.common import CEILING_KWARGS, RedisServer, ceiling_args, log, median  # noqa: E402
from forq import Queue  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.supervisor.leases.calls import LeaseCalls, leasing  # noqa: E402

LEASE_MS = 30_000


def _usec(client: Any) -> dict[str, tuple[int, int]]:
    return {k.removeprefix("cmdstat_"): (v["calls"], v["usec"])
            for k, v in client.info("commandstats").items()}


def _split(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
           jobs: int) -> dict[str, float]:
    """µs a job in the scripts, in their commands, in Lua; commands a job."""
    delta = {k: (c - before.get(k, (0, 0))[0], u - before.get(k, (0, 0))[1])
             for k, (c, u) in after.items()}
    delta.pop("info", None)
    scripts = delta.pop("evalsha", (0, 0))
    inner = sum(u for _c, u in delta.values())
    return {"script_us": scripts[1] / jobs, "commands_us": inner / jobs,
            "lua_us": (scripts[1] - inner) / jobs,
            "commands": (scripts[0] + sum(c for c, _u in delta.values())) / jobs}


def one_round(client: Any, jobs: int, batch: int, events: bool) -> dict[str, dict[str, float]]:
    client.flushdb()
    q = Queue("split", redis=client)
    q.set_events(events)
    for start in range(0, jobs, 1000):
        q.enqueue_many([{"task": "bench.noop", "args": ceiling_args(i),
                         "kwargs": CEILING_KWARGS}
                        for i in range(start, min(jobs, start + 1000))])
    calls, policy = leasing(q), _policy()
    held: list[tuple[str, str]] = []
    out = {}
    before = _usec(client)
    while len(held) < jobs:
        result = calls.claim("split-owner", batch, LEASE_MS, policy)
        if not result.leases:
            raise RuntimeError(f"claim leased nothing after {len(held)} of {jobs} jobs")
        held.extend((lease.id, lease.token) for lease in result.leases)
    out["claim"] = _split(before, before := _usec(client), jobs)
    for start in range(0, jobs, batch):
        calls.extend(held[start:start + batch], LEASE_MS)
    out["extend"] = _split(before, before := _usec(client), jobs)
    for start in range(0, jobs, batch):
        acks = LeaseCalls.parse_acks(calls.ack_many(
            [(job_id, token, "null", ()) for job_id, token in held[start:start + batch]]))
        if any(a != "ok" for a in acks):
            raise RuntimeError(f"an ack was not ok: {acks[:5]}")
    out["ack"] = _split(before, _usec(client), jobs)
    client.flushdb()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=50, help="jobs a script call")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--events-off", action="store_true", help="the queue writes no events")
    args = p.parse_args(argv)
    server = RedisServer().start()
    try:
        client = connect(server.url())
        rounds = []
        for i in range(args.rounds):
            log(f"script_split: round {i + 1}/{args.rounds}, {args.jobs} jobs, "
                f"{args.batch} a call ...")
            rounds.append(one_round(client, args.jobs, args.batch, not args.events_off))
    finally:
        server.stop()
    print(f"\n{args.jobs} mail jobs, {args.batch} a call, events "
          f"{'off' if args.events_off else 'on'}; medians of {args.rounds} rounds")
    print("| script | µs a job | in its commands | in Lua | commands a job |")
    print("| --- | --- | --- | --- | --- |")
    for name in ("claim", "extend", "ack"):
        m = {k: median(r[name][k] for r in rounds) for k in rounds[0][name]}
        print(f"| {name} | {m['script_us']:.1f} | {m['commands_us']:.1f} | "
              f"{m['lua_us']:.1f} | {m['commands']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
