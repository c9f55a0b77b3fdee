"""Rolling out new handler code: a reload (`systemctl reload`, SIGHUP) beside a restart
(`systemctl restart`: SIGTERM, the drain, a new process), under the same load, in one
run on one private Redis.

    .venv/bin/python -m bench.reload [--reps 3] [--long 8] [--rate 40] [--json FILE]

Each run: a supervisor (concurrency 4, drain_timeout 2 s) serves a producer that
enqueues short jobs (50 ms) at --rate a second, and two long jobs (--long seconds)
started first. The handler package lives in a temporary directory on the supervisor's
PYTHONPATH; each handler appends "n version time" to a runs file (one O_APPEND write)
as it starts. Two seconds in, version 2 of the package is written, then:

* reload: SIGHUP to the supervisor;
* restart: SIGTERM, and a new supervisor on the same config once the old one exited
  (what systemd does), its fork server importing version 2.

Figures (the median of --reps runs each):

* new code after: seconds from the signal to the first handler start in version 2;
* stall: the longest time without a handler start over the ten seconds from the signal
  (the producer alone starts one every 1/rate s);
* interrupted: jobs whose history shows a crash, a release or a second claim;
* double runs: jobs whose handler started more than once (the runs file);
* long jobs in v1: of the two long jobs, how many finished in the code they started with.

Every job must end succeeded (none lost), or the run fails.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # `python bench/reload.py`
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path[0] = str(_Path(__file__).resolve().parent.parent)
    __package__ = "bench"

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.common import RedisServer, log, median
from forq import Queue
from forq.store.connection import connect
from forq.testing.redis import delete_queue
from forq.testing.supervisor import SupervisorProcess, write_config

CONCURRENCY = 4
SHORT = 0.05  # seconds a short job sleeps
BEFORE = 2.0  # seconds of load before the signal
WINDOW = 10.0  # seconds after the signal over which the stall is measured
APP = '''
import os
import time

from forq import task

VERSION = {version}
RUNS = {runs!r}


@task("benchapp.work")
def work(n, seconds):
    fd = os.open(RUNS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{{n}} {{VERSION}} {{time.time():.6f}}\\n".encode())
    os.close(fd)
    time.sleep(seconds)
    return VERSION
'''


def deploy(app: Path, version: int, runs: Path) -> None:
    (app / "benchapp.py").write_text(APP.format(version=version, runs=str(runs)))


def run_once(url: str, how: str, long_seconds: float, rate: float) -> dict[str, Any]:
    """One run of `how` ("reload" or "restart"); its figures."""
    work = Path(tempfile.mkdtemp(prefix=f"forq-bench-{how}-"))
    app, runs = work / "app", work / "runs"
    app.mkdir()
    deploy(app, 1, runs)
    name = f"bench-{how}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    q = Queue(name, redis=connect(url))
    config = write_config(work / "forq.toml", url, {name: CONCURRENCY},
                          imports=("benchapp",), lease_ttl="15s", drain_timeout="2s",
                          timeout="5m")
    env = {"PYTHONPATH": str(app), "PYTHONDONTWRITEBYTECODE": "1"}
    sup = SupervisorProcess(config, env, log_path=work / "supervisor.log").start()
    ids: dict[int, str] = {}
    stop = threading.Event()

    def produce() -> None:
        producer = Queue(name, redis=connect(url))
        n = 2
        while not stop.is_set():
            ids[n] = producer.enqueue("benchapp.work", n, SHORT).id
            n += 1
            stop.wait(1 / rate)

    ids[0] = q.enqueue("benchapp.work", 0, long_seconds).id
    ids[1] = q.enqueue("benchapp.work", 1, long_seconds).id
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    supervisors = [sup]
    try:
        time.sleep(BEFORE)  # the load before the deploy (a benchmark's schedule)
        deploy(app, 2, runs)
        signalled = time.time()
        if how == "reload":
            sup.signal(signal.SIGHUP)
        else:
            sup.signal(signal.SIGTERM)
            sup.wait(timeout=60)
            supervisors.append(SupervisorProcess(config, env, log_path=work / "supervisor.log")
                               .start(wait_ready=False))
        time.sleep(WINDOW)
        stop.set()
        producer.join()
        deadline = time.monotonic() + long_seconds + 60
        ended = {}
        while time.monotonic() < deadline and len(ended) < len(ids):
            for n, jid in ids.items():
                if n not in ended and q.get(jid).state in ("succeeded", "dead", "cancelled"):
                    ended[n] = q.get(jid)
            time.sleep(0.2)
        if len(ended) < len(ids):
            raise SystemExit(f"{how}: {len(ids) - len(ended)} job(s) never ended")
    finally:
        stop.set()
        for s in supervisors:
            s.stop()
    starts = [(float(t), int(n), int(v)) for n, v, t in
              (line.split() for line in runs.read_text().splitlines())]
    starts.sort()
    new = [t for t, _n, v in starts if v == 2]
    window = [signalled] + [t for t, _n, _v in starts if signalled <= t <= signalled + WINDOW] \
        + [signalled + WINDOW]
    per_job = Counter(n for _t, n, _v in starts)
    interrupted = [n for n, job in ended.items()
                   if job.state != "succeeded" or job.crashes or len(
                       [e for e in job.history if e["event"] == "claimed"]) > 1
                   or any(e["event"] in ("released", "crashed", "reclaimed")
                          for e in job.history)]
    lost = [n for n, job in ended.items() if job.state != "succeeded"]
    if lost:
        raise SystemExit(f"{how}: jobs {lost} did not succeed")
    delete_queue(q.redis, name)
    return {
        "jobs": len(ids),
        "new_code_after_s": (new[0] - signalled) if new else None,
        "stall_s": max(b - a for a, b in zip(window, window[1:], strict=False)),
        "interrupted": len(interrupted),
        "double_runs": sum(1 for count in per_job.values() if count > 1),
        "long_in_v1": sum(1 for n in (0, 1) if ended[n].result == 1
                          and per_job[n] == 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--long", type=float, default=8.0, help="seconds of the long jobs")
    parser.add_argument("--rate", type=float, default=40.0, help="short jobs enqueued a second")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {"reload": [], "restart": []}
    with RedisServer() as server:
        for rep in range(args.reps):
            for how in results:
                log(f"{how} {rep + 1}/{args.reps}")
                results[how].append(run_once(server.url(0), how, args.long, args.rate))
    rows = {how: {k: median([r[k] for r in runs]) for k in runs[0]}
            for how, runs in results.items()}
    reload, restart = rows["reload"], rows["restart"]
    print(f"\n{args.reps} runs each; concurrency {CONCURRENCY}, {args.rate:g} short jobs/s, "
          f"2 jobs of {args.long:g} s, drain_timeout 2 s\n")
    print("| rollout | new code after, s | stall, s | interrupted | double runs | "
          "long jobs in v1 | jobs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for how, r in rows.items():
        print(f"| {how} | {r['new_code_after_s']:.3f} | {r['stall_s']:.3f} | "
              f"{r['interrupted']:g} | {r['double_runs']:g} | {r['long_in_v1']:g} of 2 | "
              f"{r['jobs']:g} |")
    print(f"\nreload ÷ restart: new code after "
          f"{reload['new_code_after_s'] / restart['new_code_after_s']:.2f}, "
          f"stall {reload['stall_s'] / restart['stall_s']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
