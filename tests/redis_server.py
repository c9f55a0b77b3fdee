"""Find the Redis the tests use, or start a private one.

``python -m tests.redis_server -- CMD...`` runs CMD with ``FORQ_REDIS_URL`` pointing at
a reachable server: the one already set (default redis://127.0.0.1:6379/15), else a
private ``redis-server`` on a free port that is stopped afterwards. Tests that must
restart or kill Redis start their own `RedisServer` the same way.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import redis

DEFAULT_TEST_URL = "redis://127.0.0.1:6379/15"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reachable(url: str, timeout: float = 1.0) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=timeout,
                                         socket_timeout=timeout).ping())
    except (redis.RedisError, OSError):
        return False


class RedisServer:
    """A private redis-server on a free port in a temporary directory."""

    def __init__(self, port: int | None = None, *, appendonly: bool = False,
                 appendfsync: str = "everysec", workdir: str | None = None) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError(
                "no redis-server on PATH: install it (apt-get install redis-server) "
                "or point FORQ_REDIS_URL at a running Redis"
            )
        self.port = port or free_port()
        self.dir = workdir or tempfile.mkdtemp(prefix="forq-redis-")
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", self.dir, "--save", "", "--daemonize", "no",
                "--appendonly", "yes" if self.appendonly else "no",
                "--appendfsync", self.appendfsync, "--loglevel", "warning"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not reachable(self.url, 0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)
        return self

    def stop(self, sig: str = "term") -> None:
        if self.proc and self.proc.poll() is None:
            if sig == "kill":
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(timeout=10)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1:]
    if not argv:
        print("usage: python -m tests.redis_server -- CMD [ARGS...]", file=sys.stderr)
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
