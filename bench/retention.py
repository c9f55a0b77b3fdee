"""Retention: what an ended job costs Redis, and that it stops costing it (issue 26).

    .venv/bin/python -m bench.retention                 # quick: 100,000 poison jobs
    .venv/bin/python -m bench.retention --poison 1000000 --flat 600

On one private Redis, through the public lease API from one client (as bench/groups.py):

* **bytes per ended job at the defaults**: `used_memory` after `--jobs` jobs (a mail
  job's arguments, bench.common.ceiling_args) were enqueued, claimed 32 at a time and
  acked (or failed fatally: dead), less before, per job. Beside it the record as it was
  before retention (the scripts of `BEFORE`, read from git, in the same run).
* **commands per job** of that claim + ack drain (INFO commandstats, those run inside
  the scripts included), this checkout against `BEFORE`: what retention adds.
* **flat memory**: a constant load (enqueue, claim and ack `--rate` jobs/s) for `--flat`
  seconds with `keep_succeeded.age = --window`, and a supervisor's reaper as far as
  retention goes: one trim pass a second (reaper_interval's default, at most 1,000
  records a pass), in a thread of its own; `used_memory` sampled each second and the
  slope after two windows fitted (bytes/s; flat is within noise).
* **poison storm**: `--poison` jobs that all die (fail fatal) with `keep_dead.count =
  10000`, trimmed by reaper passes: dead jobs left, and `used_memory` before and after.
Writes bench/RESULTS-retention.md and bench/results-retention.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RedisServer,
    ceiling_args,
    command_calls,
    commands_per_job,
    log,
    scripts_at,
)
from forq import Queue  # noqa: E402
from forq.store.connection import connect  # noqa: E402
from forq.store.control import parse_trim, trim_call  # noqa: E402
from forq.supervisor.leases.calls import leasing  # noqa: E402

OWNER = "bench-retention:1"
LEASE_MS = 600_000
BEFORE = "f0cee79"  # main before retention
HERE = Path(__file__).resolve().parent


def used(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def fill(q: Queue, n: int, extra: dict[str, Any] | None = None) -> None:
    for start in range(0, n, 5000):
        q.enqueue_many([{"task": "mail.send", "args": ceiling_args(i), **(extra or {})}
                        for i in range(start, min(n, start + 5000))])


def drain(q: Queue, n: int, dead: bool = False, batch: int = 32) -> list[str]:
    """Claim and end n jobs, `batch` per claim: one ack call per claim (as the Reporter
    sends a turn's acks), or a fatal fail per job. Returns their ids."""
    done, ids = 0, []
    calls = leasing(q)
    while done < n:
        leases = calls.claim(OWNER, min(batch, n - done), LEASE_MS).leases
        if not leases:
            raise RuntimeError(f"{q.name}: nothing claimable after {done} jobs")
        if dead:
            pipe = q.redis.pipeline(transaction=False)
            for lease in leases:
                calls.fail(lease.id, lease.token, {"message": "poison"}, "fatal", client=pipe)
            pipe.execute()
        else:
            calls.ack_many([(lease.id, lease.token, '{"sent":1}', ()) for lease in leases])
        done += len(leases)
        ids += [lease.id for lease in leases]
    return ids


def record_bytes(q: Queue, ids: list[str]) -> float:
    """What the ended jobs' records hold, per job: `used_memory` freed by deleting each
    one's keys (record, history) and index entries (dead, finished, retention)."""
    client = q.redis
    before = used(client)
    buckets = [q.keys.kept_bucket(str(b)) for b in client.smembers(q.keys.kept)]
    for start in range(0, len(ids), 1000):
        page = ids[start:start + 1000]
        pipe = client.pipeline(transaction=False)
        pipe.unlink(*[k for jid in page for k in (q.keys.job(jid), q.keys.history(jid))])
        for zset in (q.keys.dead, q.keys.finished, *buckets):
            pipe.zrem(zset, *page)
        pipe.execute()
    return (before - used(client)) / len(ids)


def trim_all(q: Queue) -> int:
    """Reaper passes until one finds nothing more to do; returns records deleted."""
    deleted = 0
    while True:
        result = parse_trim(q.scripts.run(trim_call(q.keys)))
        deleted += result.succeeded + result.dead
        if not result.more:
            return deleted


def per_job(client: Any, n: int, before: bool, dead: bool) -> dict[str, Any]:
    q = Queue("br" + uuid.uuid4().hex[:8], redis=client)
    if before:
        old = scripts_at(client, BEFORE, ("enqueue", "claim", "ack", "fail"))
        if old is None:
            return {"skipped": "no git history"}
        q.scripts._by_name.update(old)  # type: ignore[arg-type]
    base = used(client)
    fill(q, n)
    calls0 = command_calls(client)
    ids = drain(q, n, dead)
    cost = commands_per_job(calls0, command_calls(client), n)
    total = (used(client) - base) / n
    return {"bytes_per_job": record_bytes(q, ids), "queue_bytes_per_job": total,
            "commands_per_job": cost["total"], "top": cost["top"]}


def reaper(url: str, name: str, stop: threading.Event, interval: float = 1.0) -> None:
    """A supervisor's reaper, as far as retention goes: one trim pass of the queue every
    `interval` (reaper_interval's default), on its own connection."""
    q = Queue(name, redis=connect(url))
    while not stop.wait(interval):
        parse_trim(q.scripts.run(trim_call(q.keys)))


def flat(client: Any, url: str, seconds: float, rate: int, window: str) -> dict[str, Any]:
    q = Queue("bf" + uuid.uuid4().hex[:8], redis=client)
    extra = {"keep_succeeded": {"age": window}}
    samples: list[tuple[float, int]] = []
    stop = threading.Event()
    trimmer = threading.Thread(target=reaper, args=(url, q.name, stop), daemon=True)
    trimmer.start()
    t0 = time.monotonic()
    next_sample = t0
    sent = 0
    while (now := time.monotonic()) - t0 < seconds:
        due = int((now - t0) * rate) - sent
        if due > 0:
            fill(q, due, extra)
            drain(q, due)
            sent += due
        if now >= next_sample:
            samples.append((now - t0, used(client)))
            next_sample += 1.0
        time.sleep(0.2)
    stop.set()
    trimmer.join()
    window_s = float(window.rstrip("s"))
    tail = [(t, m) for t, m in samples if t > 2 * window_s]
    slope = _slope(tail)
    return {"seconds": seconds, "rate": rate, "window": window, "jobs": sent,
            "samples": len(samples), "slope_bytes_per_s": slope,
            "first_after_window": tail[0][1] if tail else None,
            "last": samples[-1][1] if samples else None,
            "retained_end": client.zcard(q.keys.kept_bucket("succeeded:10000"))}


def _slope(points: list[tuple[float, int]]) -> float | None:
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mm = sum(m for _, m in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (m - mm) for t, m in points) / var if var else None


def poison(client: Any, n: int, keep: int) -> dict[str, Any]:
    q = Queue("bp" + uuid.uuid4().hex[:8], redis=client)
    base = used(client)
    peak_dead = 0
    extra = {"keep_dead": {"count": keep}}
    chunk = 20_000
    t0 = time.monotonic()
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        fill(q, m, extra)
        drain(q, m, dead=True, batch=100)
        peak_dead = max(peak_dead, client.zcard(q.keys.dead))
        trim_all(q)  # the reaper's passes meanwhile
        log(f"retention: poison {start + m:,}/{n:,}: {client.zcard(q.keys.dead):,} dead")
    trim_all(q)
    return {"jobs": n, "keep_dead_count": keep, "dead_left": client.zcard(q.keys.dead),
            "peak_dead_between_passes": peak_dead, "seconds": time.monotonic() - t0,
            "used_before": base, "used_after": used(client),
            "bytes_per_kept_dead": (used(client) - base) / max(1, client.zcard(q.keys.dead))}


def render(res: dict[str, Any]) -> str:
    s, b = res["succeeded"], res["succeeded_before"]
    d, db = res["dead"], res["dead_before"]
    f, p = res["flat"], res["poison"]
    lines = [
        "# Retention (python -m bench.retention)", "",
        f"Runs {res.get('runs', res['date'])} on one private Redis {res['redis']}; "
        f"arguments: {res['args']}.", "",
        "## Bytes and commands per job (defaults)", "",
        "Bytes per record: `used_memory` freed by deleting the ended jobs' keys and index "
        "entries. Bytes per job, all: `used_memory` after the drain less before the enqueue, "
        "per job (the queue's capped structures included: its events stream, the recently "
        "finished index, counters).", "",
        "| | bytes per record | bytes per job, all | Redis commands per job (claim 32 + ack) |",
        "| --- | ---: | ---: | ---: |",
        *(f"| {name} | {row.get('bytes_per_job', 0):,.0f} | "
          f"{row.get('queue_bytes_per_job', 0):,.0f} | {row.get('commands_per_job', 0):.2f} |"
          for name, row in ((f"succeeded, before retention ({BEFORE})", b),
                            ("succeeded, now (defaults: compact record)", s),
                            ("dead, before retention", db), ("dead, now", d))), "",
        f"Top commands now (succeeded): {s['top']}", "",
        f"Before: {b.get('top')}", "",
        "## Flat memory under a constant load", "",
        f"{f['rate']} jobs/s for {f['seconds']:.0f} s with keep_succeeded.age = {f['window']} "
        f"({f['jobs']:,} jobs): used_memory after the window "
        f"{(f['first_after_window'] or 0) / 1e6:.2f} MB → {(f['last'] or 0) / 1e6:.2f} MB at the "
        f"end, slope {f['slope_bytes_per_s'] if f['slope_bytes_per_s'] is None else round(f['slope_bytes_per_s'])} "
        f"bytes/s ({f['retained_end']:,} records retained at the end).", "",
        "## Poison storm", "",
        f"{p['jobs']:,} jobs dead (fail fatal) with keep_dead.count = {p['keep_dead_count']:,}, "
        f"in {p['seconds']:.0f} s, trimmed after each 20,000: **{p['dead_left']:,} dead left**; "
        f"at most {p['peak_dead_between_passes']:,} between the trim passes; used_memory "
        f"{p['used_before'] / 1e6:.1f} MB before, {p['used_after'] / 1e6:.1f} MB after "
        f"({p['bytes_per_kept_dead']:,.0f} bytes per kept dead job).", "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--poison", type=int, default=100_000)
    ap.add_argument("--keep-dead", type=int, default=10_000)
    ap.add_argument("--flat", type=float, default=120.0, help="seconds of constant load")
    ap.add_argument("--rate", type=int, default=300)
    ap.add_argument("--window", default="30s")
    ap.add_argument("--parts", default="per_job,flat,poison",
                    help="which parts to run; the others keep their figures from the last "
                         "run's bench/results-retention.json")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    last = HERE / "results-retention.json"
    old: dict[str, Any] = json.loads(last.read_text()) if last.exists() else {}
    with RedisServer() as server:
        client = connect(server.url())
        res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "redis": server.version(), "args": vars(args)}
        res["runs"] = {**old.get("runs", {}), **{part: res["date"] for part in parts}}
        res["args"] = {**old.get("args", {}), **vars(args)}
        if "per_job" in parts:
            log("retention: bytes and commands per job")
            res["succeeded_before"] = per_job(client, args.jobs, True, False)
            res["succeeded"] = per_job(client, args.jobs, False, False)
            res["dead_before"] = per_job(client, args.jobs, True, True)
            res["dead"] = per_job(client, args.jobs, False, True)
            client.flushall()
        else:
            res.update({k: old[k] for k in ("succeeded_before", "succeeded", "dead_before",
                                            "dead")})
        if "flat" in parts:
            log(f"retention: {args.flat:.0f} s of constant load")
            res["flat"] = flat(client, server.url(), args.flat, args.rate, args.window)
            client.flushall()
        else:
            res["flat"] = old["flat"]
        if "poison" in parts:
            log(f"retention: {args.poison:,} poison jobs")
            res["poison"] = poison(client, args.poison, args.keep_dead)
        else:
            res["poison"] = old["poison"]
    (HERE / "results-retention.json").write_text(json.dumps(res, indent=2) + "\n")
    text = render(res)
    (HERE / "RESULTS-retention.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
