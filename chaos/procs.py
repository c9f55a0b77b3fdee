"""The processes chaos runs and hurts: one redis-server and N supervisors.

Redis runs with AOF and ``appendfsync always`` in the run's directory, on a free
port it keeps across restarts, so a restart after ``kill -9`` reloads the AOF.
Each supervisor is ``python -m forq.supervisor.cli run --config FILE`` (what ``forq run``
does) in its own session, so a Ctrl-C on the harness never reaches it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forq.testing import supervisor as harness
from forq.testing.redis import RedisServer

REPO = Path(__file__).resolve().parent.parent
HOSTNAME = socket.gethostname()


class RedisProc(RedisServer):
    """redis-server with AOF (appendfsync always), restartable on the same port and dir."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        super().__init__(port, appendonly=True, appendfsync="always",
                         workdir=workdir / "redis", logfile=str(workdir / "redis" / "redis.log"))

    def start(self, timeout: float = 30.0) -> float:  # type: ignore[override]
        """Start (or restart from the AOF); returns the wall-clock time it answered."""
        super().start(timeout)
        return time.time()

    def kill9(self) -> None:
        self.stop("kill")


@dataclass
class Incarnation:
    """One process of a supervisor slot: a restart is a new incarnation (new id)."""

    pid: int
    started: float
    ended: float | None = None
    how: str = ""  # "sigkill" | "drain" | "shutdown" | "exited"
    returncode: int | None = None
    ready: float | None = None

    @property
    def sup_id(self) -> str:
        return f"{HOSTNAME}:{self.pid}"


@dataclass
class SupervisorProc:
    """One supervisor slot: its config file, log and successive processes."""

    name: str
    config: Path
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    incarnations: list[Incarnation] = field(default_factory=list)
    state: str = "down"  # running | stopped | draining | down
    lock: threading.Lock = field(default_factory=threading.Lock)
    _log_offset: int = 0
    # each start in a fresh cgroup v2 of its own, as systemd makes one per unit start
    own_cgroup: bool = False
    cgroups: list[str] = field(default_factory=list)
    proxy: Any = None  # its path to Redis (chaos.proxy.Proxy), for partitions

    @property
    def current(self) -> Incarnation | None:
        return self.incarnations[-1] if self.incarnations else None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def launcher(self) -> list[str]:
        """`forq run`, or the deliberately broken build (`chaos.broken`) when asked."""
        built_in = {"no-fencing", "leak"} & set(self.env.get("FORQ_CHAOS_BREAK", "").split(","))
        if built_in or self.env.get("FORQ_CHAOS_DEBUG") in ("stall", "tracemalloc"):
            return ["chaos.broken"]
        return ["forq.supervisor.cli"]

    def start(self) -> Incarnation:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        enter = None
        if self.own_cgroup:
            from tests.vm import delegated_cgroup

            self.cgroups.append(delegated_cgroup(f"chaos-{self.name}"))
            procs = f"{self.cgroups[-1]}/cgroup.procs"

            def enter() -> None:
                with open(procs, "w") as f:
                    f.write("0")
        try:
            # its own pid in its environment, for a job that cannot see its parents
            # (PID 1 of namespaces of its own: chaos/handlers.py)
            self.proc = subprocess.Popen(
                ["sh", "-c", 'CHAOS_SUPERVISOR_PID=$$ exec "$@"', "sh",
                 sys.executable, "-m", *self.launcher(), "run", "--config", str(self.config)],
                stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=str(REPO),
                start_new_session=True, preexec_fn=enter,
            )
        finally:
            log.close()
        inc = Incarnation(self.proc.pid, time.time())
        self.incarnations.append(inc)
        self.state = "running"
        return inc

    def wait_ready(self, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with open(self.log_path, "rb") as f:
                    f.seek(self._log_offset)
                    if b" ready" in f.read():
                        if self.current is not None and self.current.ready is None:
                            self.current.ready = time.time()
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def ended(self, how: str, returncode: int | None, at: float | None = None) -> None:
        inc = self.current
        if inc is not None and inc.ended is None:
            inc.ended = at if at is not None else time.time()
            inc.how = how
            inc.returncode = returncode
        self.state = "down"

    def kill9(self) -> float:
        assert self.proc is not None
        self.proc.kill()
        at = time.time()
        rc = self.proc.wait(timeout=10)
        self.ended("sigkill", rc, at)
        return at

    def drain(self, timeout: float) -> int | None:
        """SIGTERM and wait for the drained exit; None if it did not exit in time."""
        assert self.proc is not None
        self.state = "draining"
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.ended("drain", rc)
        return rc

    def shutdown(self, timeout: float = 30.0) -> int | None:
        try:
            if self.proc is None or self.proc.poll() is not None:
                return None if self.proc is None else self.proc.returncode
            self.signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=timeout)
                self.ended("shutdown", rc)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait(timeout=10)
                self.ended("shutdown-killed", rc)
            return rc
        finally:
            if self.cgroups:
                from tests.vm import remove_cgroup_tree

                for path in self.cgroups:
                    remove_cgroup_tree(path)


def children_of(pid: int) -> list[tuple[int, str, float]]:
    """(pid, process title, start time) of each live child of `pid`."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    kids: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                kids.extend(int(p) for p in f.read().split())
        except OSError:
            continue
    for kid in kids:
        try:
            with open(f"/proc/{kid}/cmdline", "rb") as f:
                title = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            started = os.stat(f"/proc/{kid}").st_mtime
        except OSError:
            continue
        out.append((kid, title, started))
    return out


def job_children_of(pid: int) -> list[tuple[int, str, float]]:
    """Like `children_of`, but through the supervisor's fork server: the processes
    forked for its jobs, whichever of the two forked them."""
    out = []
    for kid in children_of(pid):
        if kid[1].startswith("forq: fork server") or "forq.supervisor.fork.server" in kid[1]:
            out.extend(children_of(kid[0]))
        else:
            out.append(kid)
    return out


def write_config(path: Path, *, name: str, redis_url: str, lease_ttl: float,
                 reaper_interval: float, drain_timeout: float, concurrency: int,
                 queue: str, max_attempts: int, max_crashes: int,
                 job_cgroups: str = "auto", others: dict[str, int] | None = None,
                 namespaces: bool = False, prefetch: int = 0, defaults: str = "") -> Path:
    def ms(seconds: float) -> str:
        return f"{int(seconds * 1000)}ms"

    return harness.write_config(
        path, redis_url, {queue: concurrency, **(others or {})}, imports=["chaos.handlers"], name=name,
        lease_ttl=ms(lease_ttl), reaper_interval=ms(reaper_interval),
        drain_timeout=ms(drain_timeout), memory_sample_interval="25ms",
        max_attempts=max_attempts, max_crashes=max_crashes, defaults=defaults,
        queue_extra=f"prefetch = {prefetch}\n" if prefetch else "",
        backoff='{ base = "100ms", factor = 2.0, max = "1s", jitter = 0.2 }',
        supervisor_extra=f'log_format = "text"\njob_cgroups = "{job_cgroups}"',
        # hostile jobs flood their output: a little of it is logged, the rest counted
        extra='[sandbox]\nmax_output_bytes = "8KiB"\n'
              + ('namespaces = true\nrequire = ["namespaces"]\n' if namespaces else ''))
