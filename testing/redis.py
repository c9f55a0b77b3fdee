"""A real redis-server for tests, chaos runs and benchmarks, on a free port.

    python -m forq.testing.redis -- CMD [ARGS...]

runs CMD with ``FORQ_REDIS_URL`` pointing at a reachable server: the one already set
(default redis://127.0.0.1:6379/15), else a private ``redis-server`` on a free port,
stopped afterwards. Tests that restart or kill Redis start their own `RedisServer`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import redis

from forq.testing.waiting import stop_process

DEFAULT_TEST_URL = "redis://127.0.0.1:6379/15"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reachable(url: str, timeout: float = 1.0) -> bool:
    """Whether a Redis answers PING at `url`."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return False


def delete_queue(client: Any, name: str) -> None:
    """Every key of queue `name`, and its name in the registry of queues."""
    keys = list(client.scan_iter(match=f"forq:{{{name}}}:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start:start + 500])
    client.srem("forq:queues", name)


class RedisServer:
    """A private redis-server on a free port (or `port`) in a directory of its own.

    With `appendonly`, a restart on the same port and directory reloads what the
    killed one had acknowledged (chaos kills Redis with SIGKILL and starts it again).
    """

    def __init__(self, port: int | None = None, *, appendonly: bool = False,
                 appendfsync: str = "everysec", workdir: str | os.PathLike[str] | None = None,
                 logfile: str = "", requirepass: str = "") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "no redis-server on PATH: install it (apt-get install redis-server) "
                "or point FORQ_REDIS_URL at a running Redis"
            )
        self.binary = binary
        self.port = port or free_port()
        self.owns_dir = workdir is None
        self.dir = str(workdir) if workdir is not None else tempfile.mkdtemp(prefix="forq-redis-")
        os.makedirs(self.dir, exist_ok=True)
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.logfile = logfile
        self.requirepass = requirepass  # clients must AUTH with it (`url` carries it)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return self.url_db(0)

    def url_db(self, db: int) -> str:
        auth = f":{self.requirepass}@" if self.requirepass else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float = 30.0) -> RedisServer:
        """Start it (or again, from its AOF); returns once it answers PING."""
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", self.dir, "--save", "", "--daemonize", "no",
                "--appendonly", "yes" if self.appendonly else "no",
                "--appendfsync", self.appendfsync]
        if self.requirepass:
            args += ["--requirepass", self.requirepass]
        args += (["--logfile", self.logfile, "--loglevel", "notice"] if self.logfile
                 else ["--loglevel", "warning"])
        # a session of its own: a Ctrl-C meant for the harness never reaches it
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + timeout
        while not reachable(self.url, 0.2):
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited with "
                                   f"{self.proc.returncode}" +
                                   (f"; see {self.logfile}" if self.logfile else ""))
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING")
            time.sleep(0.01)
        return self

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout
        return next((p[2:] for p in out.split() if p.startswith("v=")), out.strip())

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, sig: str = "term") -> None:
        """Stop it: SIGTERM (a clean shutdown), or with sig="kill" SIGKILL (a crash)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if sig == "kill":
            self.proc.kill()
            self.proc.wait(timeout=10)
        else:
            self.signal(signal.SIGCONT)  # a stopped server cannot shut down
            stop_process(self.proc)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self.owns_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1:]
    if not argv:
        print("usage: python -m forq.testing.redis -- CMD [ARGS...]", file=sys.stderr)
        return 2
    url = os.environ.get("FORQ_REDIS_URL", DEFAULT_TEST_URL)
    if reachable(url):
        os.environ["FORQ_REDIS_URL"] = url
        return subprocess.call(argv)
    try:
        server = RedisServer().start()
    except RuntimeError as exc:
        print(f"forq: no Redis reachable at {url}, and {exc}", file=sys.stderr)
        return 1
    print(f"forq: no Redis at {url}; started a private one at {server.url}", file=sys.stderr)
    os.environ["FORQ_REDIS_URL"] = server.url
    try:
        return subprocess.call(argv)
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
