"""Real supervisors as separate processes: `forq run` on a config file written here.

Used by forq's own tests, chaos runs and benchmarks, and by users' tests (see
`forq.testing.pytest_plugin`): the supervisor under test is the real one, its job
children are real forks, and it talks to a real Redis.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from forq.testing.waiting import wait_for


def write_config(path: Path, redis_url: str, queues: dict[str, int], *,
                 imports: Sequence[str] = (), lease_ttl: str = "2s",
                 reaper_interval: str = "200ms", drain_timeout: str = "5s",
                 memory_sample_interval: str = "20ms", timeout: str = "30s",
                 memory_limit: str = "256MiB", max_attempts: int = 3, max_crashes: int = 3,
                 backoff: str = '{ base = "50ms", factor = 2.0, max = "500ms", jitter = 0.1 }',
                 defaults: str = "", extra: str = "", name: str = "", queue_extra: str = "",
                 supervisor_extra: str = "", keep_history: bool | None = True) -> Path:
    """A small config: `queues` maps each queue name to its concurrency; `imports` are
    the handler modules. `defaults`, `queue_extra`, `supervisor_extra` and `extra` are
    raw TOML appended to their tables (extra: after the last one). A test reads the
    whole story of a job that succeeded, so its record keeps its history (`keep_history`,
    unlike production's compact default; None leaves the key out, for a forq before it)."""
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
imports = {json.dumps(list(imports))}
memory_sample_interval = "{memory_sample_interval}"
{supervisor_extra}

[defaults]
timeout = "{timeout}"
memory_limit = "{memory_limit}"
max_attempts = {max_attempts}
max_crashes = {max_crashes}
backoff = {backoff}
{'' if keep_history is None else f"keep_history = {str(keep_history).lower()}"}
{defaults}

{queue_tables}

[metrics]
listen = ""

{extra}
""")
    return path


class SupervisorProcess:
    """`forq run --config PATH` in its own process, logging to a file.

    `command` replaces ``python -m forq.supervisor.cli`` (e.g. chaos's broken build);
    `cgroup` is a cgroup v2 directory to start it in, as systemd would place it."""

    def __init__(self, config: Path, env: dict[str, str] | None = None,
                 cgroup: str | None = None, *, command: Sequence[str] | None = None,
                 log_path: Path | None = None, cwd: str | None = None,
                 new_session: bool = False) -> None:
        self.config = config
        self.cgroup = cgroup
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="forq-sup-", suffix=".log")[1])
        # the config names the Redis: FORQ_REDIS_URL (a test run's) would override it
        base = {k: v for k, v in os.environ.items() if k != "FORQ_REDIS_URL"}
        self.env = dict(base, **(env or {}))
        self.command = list(command or [sys.executable, "-m", "forq.supervisor.cli"])
        self.cwd = cwd
        self.new_session = new_session  # a Ctrl-C on the harness must not reach it
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, wait_ready: bool = True, timeout: float = 60.0) -> SupervisorProcess:
        self._log = open(self.log_path, "ab")
        enter: Callable[[], None] | None = self._enter_cgroup if self.cgroup else None
        self.proc = subprocess.Popen(
            [*self.command, "run", "--config", str(self.config)],
            stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
            preexec_fn=enter, start_new_session=self.new_session,
        )
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        proc = self.proc
        assert proc is not None
        wait_for(lambda: "ready" in self.log() or proc.poll() is not None,
                 timeout=timeout, message="supervisor ready")
        assert proc.poll() is None, f"supervisor exited:\n{self.log()}"

    def _enter_cgroup(self) -> None:
        with open(f"{self.cgroup}/cgroup.procs", "w") as f:
            f.write("0")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (a drain), SIGKILL if it has not exited within `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            self.close_log()
            return self.proc.returncode if self.proc else None
        try:
            os.kill(self.proc.pid, signal.SIGCONT)  # a stopped one cannot drain
        except ProcessLookupError:
            pass
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)
        finally:
            self.close_log()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.close_log()

    def close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> SupervisorProcess:
        # `with SupervisorProcess(c).start() as sup` is started already: starting it
        # again would leave the first one running, unwatched, after the block
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(timeout=15)


def _is_fork_server(proc: Any) -> bool:
    import psutil

    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return "forq.supervisor.fork.server" in cmdline or cmdline.startswith("forq: fork server")


def _is_zombie(proc: Any) -> bool:
    import psutil

    try:
        return bool(proc.status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return True


def _is_spare(proc: Any) -> bool:
    """An idle child its fork server forked in advance (no job yet)."""
    import psutil

    try:
        return " ".join(proc.cmdline()).startswith("forq: fork server: spare")
    except psutil.Error:
        return False


def spares_of(pid: int) -> list[int]:
    """The idle children (spares) of supervisor `pid`'s fork server(s)."""
    import psutil

    found: list[int] = []
    for server in fork_servers_of(pid):
        try:
            found.extend(c.pid for c in psutil.Process(server).children() if _is_spare(c))
        except psutil.Error:
            pass
    return found


def fork_servers_of(pid: int) -> list[int]:
    """The supervisor's live fork server(s) (more than one only while an old one retires)."""
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children() if _is_fork_server(c)]
    except psutil.Error:
        return []


def children_of(pid: int) -> list[int]:
    """Live job children of supervisor `pid`: the processes it or its fork server forked
    for jobs (not the fork server itself, nor its idle spares, nor what a job started
    in turn)."""
    import psutil

    try:
        direct = psutil.Process(pid).children()
    except psutil.Error:
        return []
    found = []
    for proc in direct:
        if _is_zombie(proc):  # ended (a lost fork server's orphan, reaped soon by it)
            continue
        if not _is_fork_server(proc):
            found.append(proc.pid)  # forked by the supervisor itself (fork_server = false)
            continue
        try:
            found.extend(c.pid for c in proc.children() if not _is_spare(c))
        except psutil.Error:
            pass
    return found


def wait_children(pid: int, count: int = 1, timeout: float = 10.0) -> list[int]:
    """Wait until supervisor `pid` runs at least `count` job children; returns them."""
    def enough() -> list[int]:
        found = children_of(pid)
        return found if len(found) >= count else []

    return wait_for(enough, timeout=timeout, message=f"{count} child(ren) of {pid}")
