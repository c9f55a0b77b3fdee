"""What a queue's events cost per job (lua/includes/events.lua): the same jobs through
enqueue, claim and ack (the supervisor's scripts, called as it calls them) with the
queue's events on and off, alternating, in one run on one private Redis; and the
stream's memory per entry.

    .venv/bin/python -m bench.events                 # 5,000 jobs a round, 5 rounds each
    .venv/bin/python -m bench.events --jobs 2000 --rounds 3

Per job, the median of the rounds: the commands Redis ran (INFO commandstats, those
inside scripts included), Redis's own time in the scripts (commandstats ``usec`` of
EVALSHA: enqueue, claim and ack with what they call), and the client's wall time
(calls pipelined 100 at a time, so round trips are amortised as a busy supervisor's
are). A round runs its jobs 200 at a time on two queues in turns, one with events and
one without, so a machine busy with other work slows both alike. Two shapes: "one by one" claims and acks one job a call (a supervisor with few
slots), "batched" claims and acks 50 a call (the fixed cost of a call, the switch's
HGET among it, spread over the batch). The ratio is on ÷ off of the same run.
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

from bench.common import RedisServer, command_calls, log, median  # noqa: E402
from forq import Queue  # noqa: E402
from forq.store import transitions as tr  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.supervisor.leases.calls import leasing  # noqa: E402

OWNER = "bench-events:1"
LEASE_MS = 600_000
PIPELINE = 100


def _script_usec(client: Any) -> float:
    stats = client.info("commandstats").get("cmdstat_evalsha")
    return float(stats["usec"]) if stats else 0.0


def chunk(client: Any, q: Queue, n: int, per_call: int) -> dict[str, Any]:
    """n jobs of `q` enqueued, claimed and acked `per_call` at a time: the commands Redis
    ran, its time in scripts (µs) and the client's wall time (s), in all."""
    lease = leasing(q)
    client.config_resetstat()
    calls0 = command_calls(client)
    t0 = time.perf_counter()
    for start in range(0, n, 500):
        q.enqueue_many([{"task": "bench.noop", "args": [i]}
                        for i in range(start, min(n, start + 500))])
    claimed: list[tr.Lease] = []
    while len(claimed) < n:
        pipe = client.pipeline(transaction=False)
        for _ in range(min(PIPELINE, -(-(n - len(claimed)) // per_call))):
            lease.claim(OWNER, per_call, LEASE_MS, client=pipe)
        claimed += [one for reply in pipe.execute() for one in lease.parse_claim(reply).leases]
    for start in range(0, n, PIPELINE * per_call):
        pipe = client.pipeline(transaction=False)
        part = claimed[start:start + PIPELINE * per_call]
        for k in range(0, len(part), per_call):
            lease.ack_many([(c.id, c.token, "null", ()) for c in part[k:k + per_call]],
                           client=pipe)
        pipe.execute()
    wall = time.perf_counter() - t0
    usec = _script_usec(client)
    calls1 = command_calls(client)
    calls = {k: calls1.get(k, 0) - calls0.get(k, 0) for k in calls1
             if k not in ("info", "config|resetstat", "config")}
    return {"calls": calls, "usec": usec, "wall": wall}


def one_round(client: Any, n: int, per_call: int, size: int = 200) -> dict[bool, dict[str, float]]:
    """n jobs on a queue with events and n on one without, `size` at a time in turns
    (the order alternating), so a busy machine slows both alike: per job figures."""
    queues = {}
    for events in (True, False):
        queues[events] = Queue("be" + uuid.uuid4().hex[:8], redis=client)
        queues[events].set_events(events)
    total: dict[bool, dict[str, Any]] = {e: {"calls": {}, "usec": 0.0, "wall": 0.0}
                                          for e in queues}
    for i, start in enumerate(range(0, n, size)):
        for events in ((True, False) if i % 2 == 0 else (False, True)):
            got = chunk(client, queues[events], min(size, n - start), per_call)
            into = total[events]
            into["usec"] += got["usec"]
            into["wall"] += got["wall"]
            for k, v in got["calls"].items():
                into["calls"][k] = into["calls"].get(k, 0) + v
    out = {}
    for events, q in queues.items():
        assert q.stats()["succeeded"] == n
        calls = total[events]["calls"]
        out[events] = {"commands": sum(calls.values()) / n,
                       "xadd": calls.get("xadd", 0) / n, "hget": calls.get("hget", 0) / n,
                       "hmget": calls.get("hmget", 0) / n,
                       "redis_us": total[events]["usec"] / n,
                       "wall_us": total[events]["wall"] / n * 1e6}
        for key in client.scan_iter(match=f"forq:{{{q.name}}}:*", count=1000):
            client.delete(key)
    return out


def bytes_per_entry(client: Any, n: int = 10_000) -> dict[str, float]:
    """MEMORY USAGE of a stream of `n` typical entries (enqueued, started, succeeded of
    jobs named like forq's, a supervisor id), per entry."""
    q = Queue("be" + uuid.uuid4().hex[:8], redis=client)
    q.set_events(True, keep=n)
    lease = leasing(q)
    while client.xlen(q.keys.events) < n:
        q.enqueue_many([{"task": "emails.send_welcome"}] * 200)
        for one in lease.claim("web-1.example.com:12345", 200, LEASE_MS).leases:
            lease.ack(one.id, one.token, "null")
    size = client.memory_usage(q.keys.events, samples=0)
    length = client.xlen(q.keys.events)
    for key in client.scan_iter(match=f"forq:{{{q.name}}}:*", count=1000):
        client.delete(key)
    return {"entries": length, "bytes": size, "bytes_per_entry": size / length}


def run(client: Any, n: int, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": n, "rounds": rounds, "shapes": {}}
    for shape, per_call in (("one by one", 1), ("batched", 50)):
        runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for r in range(rounds):
            log(f"events: {shape}, round {r + 1} of {rounds}")
            for events, figures in one_round(client, n, per_call).items():
                runs[events].append(figures)
        out["shapes"][shape] = {
            "on" if events else "off": {k: median(x[k] for x in rs) for k in rs[0]}
            for events, rs in runs.items()}
    out["memory"] = bytes_per_entry(client)
    return out


def print_table(res: dict[str, Any]) -> None:
    print(f"events on vs off, per job (enqueue + claim + ack; {res['jobs']:,} jobs, median "
          f"of {res['rounds']} rounds)")
    print(f"{'':<12} {'commands':>18} {'XADD HGET HMGET':>16} {'Redis µs':>22} {'client µs':>22}")
    for shape, r in res["shapes"].items():
        on, off = r["on"], r["off"]
        print(f"{shape:<12} {off['commands']:>7.2f} → {on['commands']:>6.2f} "
              f"{on['xadd'] - off['xadd']:>+5.2f} {on['hget'] - off['hget']:>+4.2f} "
              f"{on['hmget'] - off['hmget']:>+5.2f} {off['redis_us']:>7.1f} → {on['redis_us']:>5.1f} "
              f"({on['redis_us'] / off['redis_us']:.2f}x) "
              f"{off['wall_us']:>6.1f} → {on['wall_us']:>5.1f} ({on['wall_us'] / off['wall_us']:.2f}x)")
    m = res["memory"]
    print(f"stream memory: {m['bytes']:,} bytes for {m['entries']:,} entries, "
          f"{m['bytes_per_entry']:.0f} bytes an entry")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--url", help="an existing Redis (default: a private one; INFO "
                                 "commandstats is server-wide, so keep it quiet)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    server = None if args.url else RedisServer().start()
    try:
        client = connect(args.url or server.url())  # type: ignore[union-attr]
        res = run(client, args.jobs, args.rounds)
    finally:
        if server is not None:
            server.stop()
    print_table(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
