"""What a script pays per call for the helpers pasted into it: the scripts as they were
when every one carried all of lua/_lib.lua (read from git) beside this checkout's,
where each includes only the helper files it calls, in one run on one private Redis.

    .venv/bin/python -m bench.luaprologue                 # 2,000 calls a figure, 5 rounds
    .venv/bin/python -m bench.luaprologue --calls 500 --rounds 3

Each EVALSHA runs the script's whole chunk: every `local function` of its prologue is a
closure Redis builds on each call, every constant table a table, before the first line
of the script's own code. Measured:

* a one-command script (``return redis.call('EXISTS', KEYS[1])``) bare, with the old
  prologue (all of _lib) and with the clock alone (what pause includes now);
* pause, extend (one lease), claim (one job from a backlog) and ack (one job), old and
  new, on the same kind of queue.

Two figures per row, the median of `--rounds` rounds (old and new alternate which goes
first): Redis's own time, INFO commandstats ``usec_per_call`` of EVALSHA (the commands
inside the script included), and the client's µs per call with calls pipelined 100 at a
time (round trips amortised). The ratio is new ÷ old of the same run.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import REPO, RedisServer, log, median  # noqa: E402
from forq import Queue  # noqa: E402
from forq.store import transitions as tr  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.store.keys import QueueKeys  # noqa: E402
from forq.store.scripts import expand, source  # noqa: E402

OWNER = "bench-prologue:1"
LEASE_MS = 600_000
PIPELINE = 100
ONE_COMMAND = "return redis.call('EXISTS', KEYS[1])\n"
SCRIPTS = ("pause", "extend", "claim", "ack")


def before_includes() -> str | None:
    """The last commit whose scripts included all of lua/_lib.lua (the parent of the one
    that removed it), or None without the git history."""
    found = subprocess.run(["git", "log", "-1", "--diff-filter=D", "--format=%H", "--",
                            "lua/_lib.lua"], cwd=REPO, capture_output=True, text=True)
    if found.returncode or not found.stdout.strip():
        return None
    parent = subprocess.run(["git", "rev-parse", "--short", f"{found.stdout.strip()}^"],
                            cwd=REPO, capture_output=True, text=True)
    return parent.stdout.strip() or None


def reader_at(commit: str) -> Any:
    def show(name: str) -> str:
        return subprocess.run(["git", "show", f"{commit}:lua/{name}.lua"], cwd=REPO,
                              capture_output=True, text=True, check=True).stdout
    return show


def source_text(name: str) -> str:
    """This checkout's lua/NAME.lua as it is (its includes not expanded)."""
    return (REPO / "lua" / f"{name}.lua").read_text()


def texts(commit: str) -> dict[str, dict[str, str]]:
    """Per variant ("old", "new"), the text of each measured script. The one-command
    script's prologue is all of _lib (old); new, the clock alone (what pause includes),
    and the includes of claim (the most any hot-path script carries)."""
    old = reader_at(commit)

    def one_command(include: str, read: Any) -> str:
        return expand("x", lambda n: f"--@include {include}\n{ONE_COMMAND}" if n == "x"
                      else read(n))
    claims = "\n--@include ".join(re.findall(r"^--@include (\S+)$", source_text("claim"),
                                             re.MULTILINE))
    return {
        "old": {"one command": ONE_COMMAND,
                "one command + prologue": one_command("_lib", old),
                "one command + claim's prologue": one_command("_lib", old),
                **{name: expand(name, old) for name in SCRIPTS}},
        "new": {"one command": ONE_COMMAND,
                "one command + prologue": one_command("includes/time", source_text),
                "one command + claim's prologue": one_command(claims, source_text),
                **{name: source(name) for name in SCRIPTS}},
    }


Call = tuple[tuple[str, ...], tuple[Any, ...]]


def timed(client: Any, text: str, n: int, call: Any) -> tuple[float, float, list[Any]]:
    """EVALSHA of `text` n times, `call(i)` giving the i-th call's (keys, args), pipelined
    PIPELINE at a time: Redis's µs per call (INFO commandstats), the client's, replies."""
    sha = client.script_load(text)
    client.config_resetstat()
    replies: list[Any] = []
    t0 = time.perf_counter()
    for start in range(0, n, PIPELINE):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(n, start + PIPELINE)):
            keys, args = call(i)
            pipe.evalsha(sha, len(keys), *keys, *args)
        replies += pipe.execute()
    elapsed = time.perf_counter() - t0
    stats = client.info("commandstats")["cmdstat_evalsha"]
    assert int(stats["calls"]) == n, stats
    return float(stats["usec_per_call"]), elapsed / n * 1e6, replies


def one_round(client: Any, scripts: dict[str, str], n: int) -> dict[str, tuple[float, float]]:
    """Every figure for one variant's scripts, on fresh queues: {row: (Redis µs, client µs)}."""
    out: dict[str, tuple[float, float]] = {}
    empty = QueueKeys("bp" + uuid.uuid4().hex[:8])
    for name in ("one command", "one command + prologue", "one command + claim's prologue"):
        out[name] = timed(client, scripts[name], n, lambda i: ((empty.limits,), ()))[:2]
    pause = tr.pause_call(empty)
    out["pause"] = timed(client, scripts["pause"], n, lambda i: (pause.keys, pause.args))[:2]
    q = Queue("bp" + uuid.uuid4().hex[:8], redis=client)
    q.enqueue_many([{"task": "bench.noop"} for _ in range(n)])

    def claim(i: int) -> Call:
        c = tr.claim_call(q.keys, OWNER, 1, LEASE_MS)
        return c.keys, c.args
    redis_us, client_us, replies = timed(client, scripts["claim"], n, claim)
    out["claim"] = (redis_us, client_us)
    pairs = [(lease.job.id, lease.token)
             for reply in replies for lease in tr.parse_claim(reply).leases]
    assert len(pairs) == n, f"claimed {len(pairs)} of {n}"

    def extend(i: int) -> Call:
        c = tr.extend_call(q.keys, [pairs[i]], LEASE_MS)
        return c.keys, c.args
    out["extend"] = timed(client, scripts["extend"], n, extend)[:2]

    def ack(i: int) -> Call:
        c = tr.ack_call(q.keys, pairs[i][0], pairs[i][1], "null")
        return c.keys, c.args
    out["ack"] = timed(client, scripts["ack"], n, ack)[:2]
    assert q.stats()["succeeded"] == n, q.stats()
    client.flushdb()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2_000, help="calls per figure")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (median taken)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    commit = before_includes()
    if commit is None:
        print("needs the git history (the commit that removed lua/_lib.lua)")
        return 1
    scripts = texts(commit)
    lines = {variant: {name: len(text.splitlines()) for name, text in by_name.items()}
             for variant, by_name in scripts.items()}
    runs: dict[str, dict[str, list[tuple[float, float]]]] = {"old": {}, "new": {}}
    with RedisServer() as server:
        client = connect(server.url(0))
        for round_ in range(args.rounds):
            for variant in (("old", "new") if round_ % 2 == 0 else ("new", "old")):
                log(f"luaprologue: round {round_ + 1}/{args.rounds}, {variant}")
                for name, figures in one_round(client, scripts[variant], args.calls).items():
                    runs[variant].setdefault(name, []).append(figures)
        version = server.version()

    def med(variant: str, name: str, k: int) -> float:
        value = median(f[k] for f in runs[variant][name])
        assert value is not None
        return value

    print(f"\nRedis {version}; {args.calls:,} calls a figure, median of {args.rounds} rounds; "
          f"old = {commit} (every script includes all of _lib)\n")
    print("| script | lines old → new | Redis µs/call old | new | new ÷ old "
          "| client µs/call old | new | new ÷ old |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for name in runs["new"]:
        old_r, new_r = med("old", name, 0), med("new", name, 0)
        old_c, new_c = med("old", name, 1), med("new", name, 1)
        label = {"one command + prologue": "one command + prologue (old: _lib, new: clock)",
                 "one command + claim's prologue": "one command + prologue (old: _lib, "
                                                   "new: claim's includes)",
                 "one command": "one command, no include"}.get(name, name)
        print(f"| {label} | {lines['old'][name]} → {lines['new'][name]} | {old_r:.1f} | "
              f"{new_r:.1f} | {new_r / old_r:.2f} | {old_c:.1f} | {new_c:.1f} | "
              f"{new_c / old_c:.2f} |")
        rows.append({"script": name, "lines": [lines["old"][name], lines["new"][name]],
                     "redis_usec": [old_r, new_r], "client_usec": [old_c, new_c]})
    if args.json:
        args.json.write_text(json.dumps({"redis": version, "old": commit, "calls": args.calls,
                                         "rounds": args.rounds, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
