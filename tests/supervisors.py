"""Run real supervisors as separate processes for tests: `forq run` on a config file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers import wait_for

REPO = Path(__file__).resolve().parent.parent


def write_config(path: Path, redis_url: str, queues: dict[str, int], *, lease_ttl: str = "2s",
                 reaper_interval: str = "200ms", drain_timeout: str = "5s",
                 defaults: str = "", extra: str = "", name: str = "",
                 queue_extra: str = "", supervisor_extra: str = "",
                 imports: tuple[str, ...] = ("forq.examples", "tests.tasks", "tests.hostile")) -> Path:
    """A small config for tests. `defaults`, `supervisor_extra` and `extra` are raw TOML
    appended in place."""
    queue_tables = "\n".join(
        f'[[queue]]\nname = "{q}"\nconcurrency = {n}\n{queue_extra}' for q, n in queues.items()
    )
    path.write_text(f"""
[redis]
url = "{redis_url}"

[supervisor]
{f'name = "{name}"' if name else ''}
lease_ttl = "{lease_ttl}"
reaper_interval = "{reaper_interval}"
drain_timeout = "{drain_timeout}"
imports = [{", ".join(f'"{m}"' for m in imports)}]
memory_sample_interval = "20ms"
{supervisor_extra}

[defaults]
timeout = "30s"
memory_limit = "256MiB"
max_attempts = 3
max_crashes = 3
backoff = {{ base = "50ms", factor = 2.0, max = "500ms", jitter = 0.1 }}
{defaults}

{queue_tables}

[metrics]
listen = ""

{extra}
""")
    return path


class SupervisorProcess:
    """`forq run --config PATH` in its own process, logging to a file."""

    def __init__(self, config: Path, env: dict[str, str] | None = None,
                 cgroup: str | None = None) -> None:
        self.config = config
        self.cgroup = cgroup  # a cgroup v2 directory to start it in (as systemd would)
        self.log_path = Path(tempfile.mkstemp(prefix="forq-sup-", suffix=".log")[1])
        # the config names the Redis: FORQ_REDIS_URL (set by `make test`) would override it
        base = {k: v for k, v in os.environ.items() if k != "FORQ_REDIS_URL"}
        self.env = dict(base, PYTHONPATH=str(REPO), **(env or {}))
        self.proc: subprocess.Popen | None = None

    def start(self, wait_ready: bool = True, timeout: float = 60.0) -> SupervisorProcess:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "forq.supervisor.cli", "run", "--config", str(self.config)],
            stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=str(REPO),
            preexec_fn=self._enter_cgroup if self.cgroup else None,
        )
        if wait_ready:
            wait_for(lambda: "ready" in self.log() or self.proc.poll() is not None,
                     timeout=timeout, message="supervisor ready")
            assert self.proc.poll() is None, f"supervisor exited:\n{self.log()}"
        return self

    def _enter_cgroup(self) -> None:
        with open(f"{self.cgroup}/cgroup.procs", "w") as f:
            f.write("0")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self) -> SupervisorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stop(timeout=15)
        self._log.close()


def _is_fork_server(proc) -> bool:
    import psutil

    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return "forq.supervisor.fork.server" in cmdline or cmdline.startswith("forq: fork server")


def fork_servers_of(pid: int) -> list[int]:
    """The supervisor's live fork server(s) (more than one only while an old one retires)."""
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children() if _is_fork_server(c)]
    except psutil.Error:
        return []


def children_of(pid: int) -> list[int]:
    """Live job children of supervisor `pid`: the processes it or its fork server forked
    for jobs (not the fork server itself, nor what a job started in turn)."""
    import psutil

    try:
        direct = psutil.Process(pid).children()
    except psutil.Error:
        return []
    found = []
    for proc in direct:
        if not _is_fork_server(proc):
            found.append(proc.pid)  # forked by the supervisor itself (fork_server = false)
            continue
        try:
            found.extend(c.pid for c in proc.children())
        except psutil.Error:
            pass
    return found


def wait_children(pid: int, count: int = 1, timeout: float = 10.0) -> list[int]:
    return wait_for(lambda: (c := children_of(pid)) and len(c) >= count and c,
                    timeout=timeout, message=f"{count} child(ren) of {pid}")


def now() -> float:
    return time.monotonic()
