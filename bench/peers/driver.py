"""Measure one peer (RQ, Celery or Dramatiq) the way bench/supervisor.py measures forq.
Runs in the peers' venv (bench/.venv-peers) and prints one JSON object.

    python bench/peers/driver.py MODE --system SYSTEM --redis redis://127.0.0.1:PORT --db N ...

MODE: enqueue | drain | latency | recovery | ceiling.
SYSTEM: rq-fork (RQ's forking Worker ×2 processes), rq-fork-app (the same, started by a
script that loads the application first: rq_app_worker.py), rq-simple (SimpleWorker ×2),
celery (prefork pool, concurrency 2), dramatiq (2 processes × 1 thread), bullmq (Node
workers from bench/peers/bullmq; ceiling mode only).
`ceiling` (bench/ceiling.py) runs --procs worker processes (BullMQ: --concurrency each,
Dramatiq: --threads each) over --n pre-enqueued jobs carrying a realistic payload.
--app SPEC: the application every worker process loads at start (bench/apps: "heap:MiB",
"real"), for the application-size benchmark (bench/appsize.py).
Each call uses its own Redis databases from --db (RQ: N; Celery: N broker, N+1
results; Dramatiq: N broker, N+1 results) and flushes them first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))  # bench.common: stdlib only at import time

import redis  # noqa: E402

from bench.common import (  # noqa: E402
    CEILING_KWARGS,
    Counted,
    ceiling_args,
    command_calls,
    commands_per_job,
    kill_tree,
    percentile,
    redis_cost,
    rss_bytes,
    summary,
    wait_until,
)
from bench.common import workdir as make_workdir  # noqa: E402

BIN = Path(sys.executable).parent


class Peer:
    """Start workers, enqueue, count completions, read a stamp, for one system."""

    processes = 2
    poll_command = "dbsize"  # what `done` sends
    application = ""  # what its workers load (bench.apps: "heap:MiB", "real"), --app

    def __init__(self, base: str, db: int, workdir: Path) -> None:
        self.base = base.rstrip("/")
        self.db = db
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def url(self, offset: int = 0) -> str:
        return f"{self.base}/{self.db + offset}"

    def dbs(self) -> list[int]:
        return [self.db]

    def flush(self) -> None:
        for db in self.dbs():
            redis.Redis.from_url(f"{self.base}/{db}").flushdb()

    def env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONPATH=str(HERE), PYTHONUNBUFFERED="1")
        if self.application:  # the workers load it (bench.apps, found at the repo's root)
            env.update(BENCH_APP=self.application, PYTHONPATH=f"{HERE}{os.pathsep}{HERE.parent.parent}")
        return env

    def worker_cmds(self) -> list[list[str]]:
        raise NotImplementedError

    def start(self) -> None:
        for i, cmd in enumerate(self.worker_cmds()):
            path = self.workdir / f"{type(self).__name__}-{len(self.logs)}-{i}.log"
            self.logs.append(path)
            with open(path, "ab") as out:
                self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                                   env=self.env(), cwd=str(HERE)))

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def ready(self) -> bool:
        raise NotImplementedError

    def wait_ready(self, timeout: float = 60) -> None:
        def check() -> bool:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"worker exited at start:\n{self.log_text()[-3000:]}")
            return self.ready()

        wait_until(check, timeout, 0.02, f"{type(self).__name__} ready")

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def kill_all(self) -> None:
        for p in self.procs:
            kill_tree(p.pid)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_tree(p.pid)
                p.wait()
        self.procs = []

    def rss(self) -> int:
        return sum(rss_bytes(p.pid) or 0 for p in self.procs)

    # per system
    def enqueue_noops(self, n: int, how: str) -> None:
        raise NotImplementedError

    def done(self) -> int:
        raise NotImplementedError

    def enqueue_stamp(self) -> Any:
        raise NotImplementedError

    def stamp_result(self, handle: Any) -> float:
        raise NotImplementedError

    def enqueue_marked(self, path: str, seconds: float) -> Any:
        raise NotImplementedError

    def state(self, handle: Any) -> str:
        return "?"

    enqueue_methods: tuple[str, ...] = ()


class RQFork(Peer):
    worker_class = "rq.worker.Worker"
    poll_command = "zcard"

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        from rq import Queue

        self.r = redis.Redis.from_url(self.url())
        self.q = Queue("bench", connection=self.r)

    def worker_cmds(self) -> list[list[str]]:
        return [[str(BIN / "rq"), "worker", "-u", self.url(), "-w", self.worker_class,
                 "-n", f"bench-{os.getpid()}-{len(self.logs)}-{i}", "bench"]
                for i in range(self.processes)]

    def ready(self) -> bool:
        from rq import Worker

        return Worker.count(connection=self.r) >= self.processes

    enqueue_methods = ("enqueue", "enqueue_many")

    def _retry(self) -> Any:
        from rq import Retry

        return Retry(max=3)

    def enqueue_noops(self, n: int, how: str) -> None:
        import peer_tasks

        if how == "enqueue":
            retry = self._retry()
            for _ in range(n):
                self.q.enqueue(peer_tasks.noop, retry=retry)
        else:
            from rq import Queue

            retry = self._retry()
            for start in range(0, n, 5000):
                self.q.enqueue_many([Queue.prepare_data(peer_tasks.noop, retry=retry)
                                     for _ in range(min(5000, n - start))])

    def done(self) -> int:
        from rq.registry import FinishedJobRegistry

        return self.r.zcard(FinishedJobRegistry(queue=self.q).key)

    def enqueue_stamp(self) -> Any:
        import peer_tasks

        return self.q.enqueue(peer_tasks.stamp)

    def stamp_result(self, job: Any) -> float:
        from rq.job import JobStatus

        wait_until(lambda: job.get_status(refresh=True) == JobStatus.FINISHED, 30, 0.002,
                   "rq stamp")
        return float(job.return_value())

    def enqueue_marked(self, path: str, seconds: float) -> Any:
        import peer_tasks

        return self.q.enqueue(peer_tasks.marked_sleep, path, seconds, retry=self._retry(),
                              job_timeout=120)

    def state(self, job: Any) -> str:
        try:
            return str(job.get_status(refresh=True))
        except Exception as exc:  # noqa: BLE001
            return f"unknown ({exc})"


class RQSimple(RQFork):
    worker_class = "rq.worker.SimpleWorker"

    def enqueue_ceiling(self, n: int) -> None:
        import peer_tasks
        from rq import Queue

        for start in range(0, n, 1000):
            self.q.enqueue_many([Queue.prepare_data(peer_tasks.noop, args=ceiling_args(i),
                                                    kwargs=CEILING_KWARGS)
                                 for i in range(start, min(n, start + 1000))])


class RQForkApp(RQFork):
    """RQ's forking Worker started by a script that loads the application first
    (rq_app_worker.py), as RQ's docs advise for a big one: each work horse inherits it."""

    def worker_cmds(self) -> list[list[str]]:
        return [[sys.executable, str(HERE / "rq_app_worker.py"), self.url(),
                 f"bench-{os.getpid()}-{len(self.logs)}-{i}", "bench"]
                for i in range(self.processes)]


class CeleryPeer(Peer):
    def dbs(self) -> list[int]:
        return [self.db, self.db + 1]

    def env(self) -> dict[str, str]:
        return dict(super().env(), BENCH_CELERY_BROKER=self.url(), BENCH_CELERY_BACKEND=self.url(1))

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        os.environ.update(BENCH_CELERY_BROKER=self.url(), BENCH_CELERY_BACKEND=self.url(1))
        import celery_app

        self.app = celery_app
        self.results = redis.Redis.from_url(self.url(1))

    def worker_cmds(self) -> list[list[str]]:
        return [[str(BIN / "celery"), "-A", "celery_app", "worker", "-P", "prefork", "-c",
                 str(self.processes), "-Q", "bench", "-l", "INFO",
                 "-n", f"bench{os.getpid()}{len(self.logs)}@%h"]]

    def ready(self) -> bool:
        return " ready." in self.log_text()

    enqueue_methods = ("delay",)

    def enqueue_noops(self, n: int, how: str) -> None:
        noop = self.app.noop
        for _ in range(n):
            noop.delay()

    def done(self) -> int:
        return self.results.dbsize()

    def enqueue_stamp(self) -> Any:
        return self.app.stamp.delay()

    def stamp_result(self, res: Any) -> float:
        return float(res.get(timeout=30, interval=0.002))

    def enqueue_marked(self, path: str, seconds: float) -> Any:
        return self.app.marked_sleep.delay(path, seconds)

    def state(self, res: Any) -> str:
        r = redis.Redis.from_url(self.url())
        unacked = r.hlen("unacked")
        queued = r.llen("bench")
        return f"{res.state}; broker: {queued} queued, {unacked} unacked"


class DramatiqPeer(Peer):
    def dbs(self) -> list[int]:
        return [self.db, self.db + 1]

    def env(self) -> dict[str, str]:
        return dict(super().env(), BENCH_DRAMATIQ_BROKER=self.url(),
                    BENCH_DRAMATIQ_RESULTS=self.url(1))

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        os.environ.update(BENCH_DRAMATIQ_BROKER=self.url(), BENCH_DRAMATIQ_RESULTS=self.url(1))
        import dramatiq_app

        self.app = dramatiq_app
        self.results = redis.Redis.from_url(self.url(1))

    threads = 1

    def worker_cmds(self) -> list[list[str]]:
        return [[str(BIN / "dramatiq"), "dramatiq_app", "--processes", str(self.processes),
                 "--threads", str(self.threads), "--queues", "bench"]]

    def enqueue_ceiling(self, n: int) -> None:
        noop = self.app.noop
        for i in range(n):
            noop.send(*ceiling_args(i), **CEILING_KWARGS)

    def ready(self) -> bool:
        return self.log_text().count("ready for action") >= self.processes

    enqueue_methods = ("send",)

    def enqueue_noops(self, n: int, how: str) -> None:
        noop = self.app.noop
        for _ in range(n):
            noop.send()

    def done(self) -> int:
        return self.results.dbsize()

    def enqueue_stamp(self) -> Any:
        return self.app.stamp.send()

    def stamp_result(self, message: Any) -> float:
        return float(message.get_result(backend=self.app.backend, block=True, timeout=30_000))

    def enqueue_marked(self, path: str, seconds: float) -> Any:
        return self.app.marked_sleep.send(path, seconds)

    def state(self, message: Any) -> str:
        r = redis.Redis.from_url(self.url())
        acks = sum(r.scard(k) for k in r.scan_iter("dramatiq:__acks__.*"))
        queued = r.llen("dramatiq:bench")
        return f"broker: {queued} queued, {acks} unacked"


class BullMQPeer(Peer):
    """BullMQ's Node Worker: --procs processes × --concurrency each (ceiling mode)."""

    poll_command = "zcard"
    concurrency = 50
    NODE_DIR = HERE / "bullmq"
    QUEUE = "ceiling"

    def node(self, *args: str) -> list[str]:
        return ["node", str(self.NODE_DIR / "ceiling.js"), *args]

    def worker_cmds(self) -> list[list[str]]:
        return [self.node("work", self.url(), self.QUEUE, str(self.concurrency))
                for _ in range(self.processes)]

    def ready(self) -> bool:
        return self.log_text().count("ready") >= self.processes

    def enqueue_ceiling(self, n: int) -> None:
        subprocess.run(self.node("enqueue", self.url(), self.QUEUE, str(n)), check=True,
                       timeout=300, cwd=str(self.NODE_DIR))

    def done(self) -> int:
        return redis.Redis.from_url(self.url()).zcard(f"bull:{self.QUEUE}:completed")


SYSTEMS = {"rq-fork": RQFork, "rq-fork-app": RQForkApp, "rq-simple": RQSimple,
           "celery": CeleryPeer,
           "dramatiq": DramatiqPeer, "bullmq": BullMQPeer}


# -- modes ---------------------------------------------------------------------------------


def mode_enqueue(peer: Peer, n: int, reps: int, n_batch: int) -> dict[str, Any]:
    out = {}
    for how in peer.enqueue_methods:
        count = n_batch if how == "enqueue_many" else n
        rates = []
        for _ in range(reps):
            peer.flush()
            peer.enqueue_noops(10, how)  # warm: connections, scripts
            peer.flush()
            t0 = time.perf_counter()
            peer.enqueue_noops(count, how)
            rates.append(count / (time.perf_counter() - t0))
        out[how] = dict(summary(rates), n=count)
    peer.flush()
    return out


def mode_drain(peer: Peer, n: int, reps: int) -> dict[str, Any]:
    rates, rss = [], []
    calls: dict[str, Any] = {}
    server = redis.Redis.from_url(peer.url())
    for _ in range(reps):
        peer.flush()
        peer.enqueue_noops(n, "enqueue_many" if "enqueue_many" in peer.enqueue_methods
                           else peer.enqueue_methods[0])
        peer.start()
        poll = Counted(peer.done)
        try:
            first = wait_until(peer.done, 120, 0.002, "first job done")
            t1 = time.perf_counter()
            calls1 = command_calls(server)
            done = wait_until(lambda p=poll: (c := p()) >= n and c, max(120, n / 20), 0.01,
                              f"{n} jobs done")
            t2 = time.perf_counter()
            calls = commands_per_job(calls1, command_calls(server), done - first,
                                     {peer.poll_command: poll.calls})
            rss.append(peer.rss())
            rates.append((done - first) / (t2 - t1))
        finally:
            peer.stop()
    peer.flush()
    return dict(summary(rates), n=n, worker_rss=percentile(rss, 50),
                redis_commands_per_job=calls)


def mode_latency(peer: Peer, samples: int) -> dict[str, Any]:
    peer.flush()
    peer.start()
    lat, after = [], []
    try:
        peer.wait_ready()
        time.sleep(1.0)
        peer.stamp_result(peer.enqueue_stamp())  # warm
        time.sleep(0.2)
        for _ in range(samples):
            t0 = time.time()
            handle = peer.enqueue_stamp()
            t1 = time.time()
            started = peer.stamp_result(handle)
            lat.append((started - t0) * 1000)
            after.append((started - t1) * 1000)
            time.sleep(random.uniform(0.02, 0.05))
    finally:
        peer.stop()
        peer.flush()
    return {"samples": samples, "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
            "max_ms": max(lat), "all_ms": [round(x, 3) for x in lat],
            "after_all_ms": [round(x, 3) for x in after]}


def mode_ceiling(peer: Peer, n: int, procs: int, concurrency: int) -> dict[str, Any]:
    """The Redis side of `n` pre-enqueued no-op jobs drained by `procs` workers."""
    peer.processes = procs
    peer.concurrency = peer.threads = concurrency
    peer.flush()
    peer.enqueue_ceiling(n)
    server = redis.Redis.from_url(peer.url())
    peer.start()
    try:
        res = redis_cost(server, peer.done, n, peer.poll_command, max(120, n / 20))
    finally:
        peer.stop()
    peer.flush()
    return dict(res, n=n, procs=procs, concurrency=concurrency)


def _markers(path: Path) -> list[tuple[int, float]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.split("\n"):
        parts = line.split()
        if len(parts) == 2:
            out.append((int(parts[0]), float(parts[1])))
    return out


def mode_recovery(peer: Peer, kind: str, reps: int, cap: float) -> dict[str, Any]:
    """SIGKILL the process running a 20 s job (kind=child) or the whole worker with its
    children (kind=worker; a fresh worker is started at once, as systemd would): seconds
    until the job starts again, or None with the job's state after `cap` seconds."""
    times: list[float | None] = []
    notes: list[str] = []
    for i in range(reps):
        peer.flush()
        marker = peer.workdir / f"marks-{kind}-{i}"
        peer.start()
        restarts = 0
        try:
            peer.wait_ready()
            handle = peer.enqueue_marked(str(marker), 20)
            first = wait_until(lambda m=marker: _markers(m), 30, 0.002, "job start")
            t_kill = time.time()
            if kind == "child":
                os.kill(first[0][0], signal.SIGKILL)
            else:
                peer.kill_all()
                peer.start()
            deadline = time.monotonic() + cap
            again = None
            while time.monotonic() < deadline:
                marks = _markers(marker)
                if len(marks) >= 2:
                    again = marks[1][1] - t_kill
                    break
                if not peer.alive():  # the worker gave up: restart it, as systemd would
                    restarts += 1
                    peer.kill_all()
                    peer.start()
                time.sleep(0.005)
            times.append(again)
            note = "" if again is not None else f"not within {cap:.0f} s: {peer.state(handle)}"
            if restarts:
                note = (note + "; " if note else "") + f"worker exited, restarted {restarts}x"
            notes.append(note)
        finally:
            peer.kill_all()
        if times[-1] is None:
            break  # "never" does not need repeating
    peer.flush()
    return {"kind": kind, "reps": len(times), "cap_s": cap, "seconds": summary(times),
            "never": any(t is None for t in times), "notes": notes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("enqueue", "drain", "latency", "recovery", "ceiling"))
    p.add_argument("--system", choices=sorted(SYSTEMS), required=True)
    p.add_argument("--redis", required=True, help="redis://127.0.0.1:PORT (no db)")
    p.add_argument("--db", type=int, default=1)
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--n-batch", type=int, default=20000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--samples", type=int, default=100)
    p.add_argument("--kind", choices=("child", "worker"), default="child")
    p.add_argument("--cap", type=float, default=30.0)
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--app", default="", help="what the workers load first (bench.apps)")
    args = p.parse_args(argv)
    workdir = make_workdir()
    peer = SYSTEMS[args.system](args.redis, args.db, workdir)
    peer.application = args.app
    try:
        if args.mode == "enqueue":
            res = mode_enqueue(peer, args.n, args.reps, args.n_batch)
        elif args.mode == "drain":
            res = mode_drain(peer, args.n, args.reps)
        elif args.mode == "latency":
            res = mode_latency(peer, args.samples)
        elif args.mode == "ceiling":
            res = mode_ceiling(peer, args.n, args.procs, args.concurrency)
        else:
            res = mode_recovery(peer, args.kind, args.reps, args.cap)
    finally:
        peer.kill_all()
    res["system"] = args.system
    json.dump(res, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
