"""What every benchmark needs: a private Redis, a forq supervisor as a real process,
waiting, medians and percentiles, and a description of the machine.

Nothing here imports `supervisor`: the benchmarks use forq as a user does, through
`jobs` (the producer API) and the `forq run` command line.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
FORQ_PYTHON = sys.executable  # the repo's venv: forq runs from it


_WORKROOT: Path | None = None


def workdir() -> Path:
    """A fresh directory for one measurement's configs, logs and markers, under one
    root per process that is removed at exit (kept with BENCH_KEEP_FILES=1)."""
    global _WORKROOT
    if _WORKROOT is None:
        _WORKROOT = Path(tempfile.mkdtemp(prefix="forq-bench-"))
        if not os.environ.get("BENCH_KEEP_FILES"):
            import atexit

            atexit.register(shutil.rmtree, _WORKROOT, True)
    return Path(tempfile.mkdtemp(dir=_WORKROOT))


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- numbers --------------------------------------------------------------------------


def median(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100) of `values`."""
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return None
    k = max(0, min(len(vals) - 1, int(round(p / 100 * len(vals) + 0.5)) - 1))
    return vals[k]


def summary(values: Sequence[float]) -> dict[str, Any]:
    vals = [v for v in values if v is not None]
    return {"median": median(vals), "min": min(vals) if vals else None,
            "max": max(vals) if vals else None, "runs": list(vals)}


class Counted:
    """A callable that counts its calls (polls of Redis, to leave out of command counts)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.fn()


def wait_until(pred: Callable[[], Any], timeout: float, interval: float = 0.005,
               what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# -- a private Redis --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server on a free port: no persistence, so disk never adds noise."""

    def __init__(self) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError("no redis-server on PATH (apt-get install redis-server)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="forq-bench-redis-")
        self.proc: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
             "--databases", "16"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited at start")
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(up, 10, 0.02, "redis-server")
        return self

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout
        for part in out.split():
            if part.startswith("v="):
                return part[2:]
        return out.strip()

    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def flushall(self) -> None:
        import redis

        redis.Redis(port=self.port).flushall()

    def stop(self) -> None:
        from forq.testing.waiting import stop_process

        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def command_calls(client: Any) -> dict[str, int]:
    """Redis's per-command call counts (INFO commandstats), server-wide."""
    return {k.removeprefix("cmdstat_"): int(v["calls"])
            for k, v in client.info("commandstats").items()}


def command_usec(client: Any) -> dict[str, int]:
    """Redis's per-command time in µs (INFO commandstats), server-wide; a script's
    (evalsha, eval) includes the commands it ran, which are counted on their own too."""
    return {k.removeprefix("cmdstat_"): int(v["usec"])
            for k, v in client.info("commandstats").items()}


def commands_per_job(before: dict[str, int], after: dict[str, int], jobs: int,
                     polls: dict[str, int] | None = None) -> dict[str, Any]:
    """Commands Redis ran per finished job between two `command_calls` snapshots,
    counting those run inside scripts, less the benchmark's own: `polls` (command →
    calls made by the benchmark) and INFO."""
    polls = dict(polls or {}, info=1 << 60)
    per = {}
    for k in after:
        calls = after.get(k, 0) - before.get(k, 0) - polls.get(k, 0)
        if calls > 0:
            per[k] = calls / jobs
    top = dict(sorted(per.items(), key=lambda kv: -kv[1])[:12])
    return {"total": sum(per.values()), "top": {k: round(v, 2) for k, v in top.items()}}


def redis_cpu_seconds(client: Any) -> float:
    """CPU seconds the Redis server has used, user + system, all its threads."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# The same realistic payload for every system of the ceiling benchmark: a mail job's
# arguments, about 170 bytes of JSON.
def ceiling_args(i: int) -> list[Any]:
    return [f"user-{i}@example.com", {"template": "welcome-v3", "locale": "en-GB",
                                      "vars": {"name": "Ada Lovelace", "plan": "pro",
                                               "trial_days": 14}}]


CEILING_KWARGS = {"campaign": "autumn-2026", "dry_run": False}


def redis_cost(client: Any, done: Callable[[], int], n: int, poll_command: str,
               timeout: float) -> dict[str, Any]:
    """Watch `done()` (jobs finished so far, one `poll_command` per call) from the first
    finished job until `n`: the Redis side of those jobs — commands per job (commandstats,
    those inside scripts included, the polls left out), Redis CPU µs per job (INFO cpu
    deltas), how busy Redis was, and the rate Redis could carry at one full core."""
    poll = Counted(done)
    first = wait_until(poll, timeout, 0.005, "the first job done")
    t1, calls1, cpu1 = time.perf_counter(), command_calls(client), redis_cpu_seconds(client)
    last = wait_until(lambda: (c := poll()) >= n and c, timeout, 0.02, f"{n} jobs done")
    t2, calls2, cpu2 = time.perf_counter(), command_calls(client), redis_cpu_seconds(client)
    jobs = last - first
    cpu = cpu2 - cpu1
    return {"jobs": jobs, "jobs_per_s": jobs / (t2 - t1),
            "commands_per_job": commands_per_job(calls1, calls2, jobs,
                                                 {poll_command: poll.calls}),
            "redis_cpu_us_per_job": cpu / jobs * 1e6,
            "redis_busy": cpu / (t2 - t1),
            "redis_ceiling_jobs_per_s": jobs / cpu if cpu > 0 else None}


# -- processes --------------------------------------------------------------------------


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """SIGKILL a process and every descendant at once (a machine or container dying)."""
    import psutil

    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


# -- a forq supervisor --------------------------------------------------------------------


def write_forq_config(path: Path, redis_url: str, queue: str, concurrency: int = 2, *,
                      lease_ttl: str = "15s", reaper_interval: str = "1s",
                      imports: Sequence[str] = ("bench.tasks",), timeout: str = "5m",
                      memory_sample_interval: str = "50ms", extra: str = "",
                      queue_extra: str = "", supervisor_extra: str = "",
                      keep_history: bool | None = True) -> Path:
    """One queue, the benchmarks' defaults (a lease long enough never to matter), the
    test harness's writer (forq.testing.supervisor.write_config). `keep_history`: as
    there (None: the production default, a compact succeeded record)."""
    from forq.testing.supervisor import write_config

    return write_config(path, redis_url, {queue: concurrency}, imports=imports,
                        lease_ttl=lease_ttl, reaper_interval=reaper_interval,
                        drain_timeout="10s", memory_sample_interval=memory_sample_interval,
                        timeout=timeout, memory_limit="512MiB", max_crashes=5,
                        queue_extra=queue_extra, supervisor_extra=supervisor_extra,
                        extra=extra, keep_history=keep_history)


class ForqSupervisor:
    """`python -m forq.supervisor.cli run --config FILE` from the repo's venv."""

    def __init__(self, config: Path, log_path: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.config = config
        self.log_path = log_path or workdir() / "supervisor.log"
        self.env = env or {}  # added to its environment (the fork server inherits it)
        self.proc: subprocess.Popen | None = None
        self._log = None
        # how `forq` is started; experiments may swap in a patched launcher
        self.command = [FORQ_PYTHON, "-m", "forq.supervisor.cli"]

    def start(self, wait_ready: bool = True, timeout: float = 30.0) -> ForqSupervisor:
        self._log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONPATH=str(REPO), **self.env)
        env.pop("FORQ_REDIS_URL", None)  # the config's URL, not the environment's
        self.proc = subprocess.Popen(
            [*self.command, "run", "--config", str(self.config)],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        assert self.proc is not None
        wait_until(lambda: self.proc.poll() is not None or " ready" in self.log(), timeout,
                   0.01, "supervisor ready")
        if self.proc.poll() is not None:
            raise RuntimeError(f"supervisor exited at start:\n{self.log()[-3000:]}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def rss(self) -> int | None:
        return rss_bytes(self.pid)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._close()
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)  # a second signal: stop at once
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_tree(self.proc.pid)
                self.proc.wait(timeout=10)
        self._close()

    def _close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def cleanup(self) -> None:
        self.stop()
        try:
            self.log_path.unlink()
        except OSError:
            pass

    def __enter__(self) -> ForqSupervisor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the machine ----------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    try:  # the kernel's transparent huge pages ([supervisor].huge_pages needs them)
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = next((w[1:-1] for w in f.read().split() if w.startswith("[")), "")
    except OSError:
        thp = ""
    return {
        "cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / (1 << 30), 1),
        "kernel": platform.release(), "python": platform.python_version(),
        "load_at_start": os.getloadavg()[0], "thp": thp,
    }


def remove_queue(r: Any, name: str) -> None:
    """UNLINK every key of a benchmark queue (a million jobs: two million keys) in batches."""
    batch: list[str] = []
    for key in r.scan_iter(match=f"forq:{{{name}}}:*", count=10_000):
        batch.append(key)
        if len(batch) >= 10_000:
            r.unlink(*batch)
            batch.clear()
    if batch:
        r.unlink(*batch)
    r.srem("forq:queues", name)


def scripts_at(client: Any, commit: str,
               names: Sequence[str] = ("enqueue", "claim", "ack")) -> dict[str, Any] | None:
    """The scripts `names` as they were at `commit` (their includes resolved from the
    same commit), registered on `client`: a feature's cost is measured against the
    path before it, in the same run. None without the git history (an sdist)."""
    from forq.store.scripts import expand

    repo = Path(__file__).resolve().parent.parent

    def show(name: str) -> str:
        return subprocess.run(["git", "show", f"{commit}:lua/{name}.lua"], cwd=repo,
                              capture_output=True, text=True, check=True).stdout
    try:
        return {name: client.register_script(expand(name, show)) for name in names}
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None


def enqueue_noops(q: Any, n: int, extra: Callable[[int], dict[str, Any]] | None = None,
                  chunk: int = 50_000) -> float:
    """n no-op jobs by enqueue_many, job i with `extra(i)` added to its spec; jobs/s."""
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        specs = []
        for i in range(start, min(n, start + chunk)):
            spec: dict[str, Any] = {"task": "bench.noop", "args": [i, "a short payload"]}
            if extra is not None:
                spec.update(extra(i))
            specs.append(spec)
        q.enqueue_many(specs)
    return n / (time.perf_counter() - t0)
