"""What a handler's own transitions cost Redis (issue 29, items 1 and 2): a snooze
(`raise Retry`) beside a failure's retry, a throttle beside a release, a page of parents'
results beside a durable step; and what they added to the claim and fail paths, against
those scripts as they were before (read from git), in one run on one private Redis.

    .venv/bin/python -m bench.control                 # 2,000 calls a figure, 5 rounds
    .venv/bin/python -m bench.control --calls 500 --rounds 3

Each figure is Redis's own time per call (INFO commandstats ``usec_per_call`` of
EVALSHA, the commands inside the script included), the median of `--rounds` rounds, the
calls pipelined 100 at a time (`bench.luaprologue.timed`). The ratio is to the row's
baseline, measured in the same round.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, RedisServer, log, median  # noqa: E402
from bench.luaprologue import Call, reader_at, timed  # noqa: E402
from forq import Queue  # noqa: E402
from forq.store import control
from forq.store import transitions as tr  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.store.scripts import expand, source  # noqa: E402

OWNER = "bench-control:1"
LEASE_MS = 600_000
ERROR = {"type": "E", "message": "m", "traceback": "", "reason": "r"}


def before_control() -> str | None:
    """The commit before lua/throttle.lua was added (None without the git history)."""
    found = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                            "lua/throttle.lua"], cwd=REPO, capture_output=True, text=True)
    first = found.stdout.split()[-1] if found.returncode == 0 and found.stdout.split() else ""
    if not first:
        return None
    parent = subprocess.run(["git", "rev-parse", "--short", f"{first}^"], cwd=REPO,
                            capture_output=True, text=True)
    return parent.stdout.strip() or None


def leased(client: Any, n: int, grouped: bool = False) -> tuple[Queue, list[tuple[str, str]]]:
    """A fresh queue with n jobs leased to OWNER (`grouped`: each in a group of its own,
    as one group runs one job at a time): (the queue, [(id, token)])."""
    q = Queue("bc" + uuid.uuid4().hex[:8], redis=client)
    q.enqueue_many([{"task": "bench.noop", **({"group": f"g{i}"} if grouped else {})}
                    for i in range(n)])
    pairs: list[tuple[str, str]] = []
    while len(pairs) < n:
        more = leased_in(q, min(500, n - len(pairs)))[1]
        assert more, f"leased {len(pairs)} of {n}"
        pairs += more
    return q, pairs


def one_round(client: Any, old: dict[str, str], n: int, flip: bool) -> dict[str, float]:
    """Redis µs per call of each row, on fresh queues (`flip`: each script measured
    before its former self, not after)."""
    out: dict[str, float] = {}

    def figure(name: str, text: str, call: Callable[[int], Call]) -> None:
        out[name] = timed(client, text, n, call)[0]

    def ordered(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return pairs[::-1] if flip else pairs

    for variant, claim in ordered([("claim, before", old["claim"]), ("claim", source("claim"))]):
        q = Queue("bc" + uuid.uuid4().hex[:8], redis=client)
        q.enqueue_many([{"task": "bench.noop"} for _ in range(n)])
        c = tr.claim_call(q.keys, OWNER, 1, LEASE_MS)
        figure(variant, claim, lambda i, c=c: (c.keys, c.args))
    for variant, fail in ordered([("fail (retry), before", old["fail"]),
                                  ("fail (retry)", source("fail"))]):
        q, pairs = leased(client, n)
        figure(variant, fail, lambda i, q=q, pairs=pairs: _call(
            tr.fail_call(q.keys, *pairs[i], ERROR, "retry", jitter=0.5)))
    q, pairs = leased(client, n)
    figure("snooze (fail, mode snooze)", source("fail"), lambda i: _call(
        tr.fail_call(q.keys, *pairs[i], ERROR, "snooze", jitter=0.5, delay_ms=1000)))
    q, pairs = leased(client, n)
    figure("release", source("release"), lambda i: _call(tr.release_call(q.keys, *pairs[i])))
    q, pairs = leased(client, n)
    figure("throttle (queue)", source("throttle"), lambda i: _call(
        control.throttle_call(q.keys, *pairs[i], 1000, False, "429")))
    q, pairs = leased(client, n, grouped=True)
    figure("throttle (group)", source("throttle"), lambda i: _call(
        control.throttle_call(q.keys, *pairs[i], 1000, True, "429")))
    q, pairs = leased(client, 1)
    figure("step", source("step"), lambda i: _call(
        tr.step_call(q.keys, *pairs[0], f"s{i}", '{"id":7}')))
    for count in (1, 100):
        q = Queue("bc" + uuid.uuid4().hex[:8], redis=client)
        parents = q.enqueue_many([{"task": "bench.noop"} for _ in range(count)])
        _, done = leased_in(q, count)
        for job_id, token in done:
            client.evalsha(client.script_load(source("ack")), 3,
                           *tr.ack_call(q.keys, job_id, token, '{"rows":3}').keys,
                           *tr.ack_call(q.keys, job_id, token, '{"rows":3}').args)
        q.enqueue("bench.noop", depends_on=[p.id for p in parents])
        _, (child,) = leased_in(q, 1)
        figure(f"parents: a page of {count}", source("parents"), lambda i, q=q, child=child:
               _call(control.parents_call(q.keys, *child, 0, 500, 1 << 20)))
    client.flushdb()
    return out


def leased_in(q: Queue, n: int) -> tuple[Queue, list[tuple[str, str]]]:
    """n jobs of `q`'s backlog leased to OWNER."""
    reply = q.redis.evalsha(q.redis.script_load(source("claim")), 5,
                            *tr.claim_call(q.keys, OWNER, n, LEASE_MS).keys,
                            *tr.claim_call(q.keys, OWNER, n, LEASE_MS).args)
    return q, [(lease.id, lease.token) for lease in tr.parse_claim(reply).leases]


def _call(call: tr.ScriptCall) -> Call:
    return call.keys, call.args


BASELINES = {"claim": "claim, before", "fail (retry)": "fail (retry), before",
             "snooze (fail, mode snooze)": "fail (retry)", "throttle (queue)": "release",
             "throttle (group)": "release", "parents: a page of 1": "step",
             "parents: a page of 100": "step"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2_000, help="calls per figure")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (median taken)")
    args = parser.parse_args(argv)
    commit = before_control()
    if commit is None:
        print("needs the git history (the commit that added lua/throttle.lua)")
        return 1
    old = {name: expand(name, reader_at(commit)) for name in ("claim", "fail")}
    runs: dict[str, list[float]] = {}
    with RedisServer() as server:
        client = connect(server.url(0))
        for round_ in range(args.rounds):
            log(f"control: round {round_ + 1}/{args.rounds}")
            for name, value in one_round(client, old, args.calls, round_ % 2 == 1).items():
                runs.setdefault(name, []).append(value)
        version = server.version()
    print(f"\nRedis {version}; {args.calls:,} calls a figure, median of {args.rounds} rounds; "
          f"before = {commit}\n")
    print("| script | Redis µs/call | baseline | its µs/call | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for name, values in runs.items():
        if name in BASELINES.values() and name not in BASELINES:
            continue
        value = median(values)
        base = BASELINES.get(name)
        if base is None or value is None:
            continue
        base_value = median(runs[base])
        assert base_value is not None
        print(f"| {name} | {value:.1f} | {base} | {base_value:.1f} | "
              f"{value / base_value:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
