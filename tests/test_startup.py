"""Start-up and reload as systemd sees them, over a real notify socket: READY=1 before
Redis answers (with a STATUS saying what it waits for, and the watchdog fed meanwhile),
RELOADING=1 … READY=1 around a reload, and the start-up line naming the Redis endpoint
and where its URL came from. tests/test_systemd_vm.py runs the same under a real systemd.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from forq import Queue
from forq.store.connection import connect
from tests.helpers import wait_for
from tests.redis_server import RedisServer, free_port
from tests.supervisors import SupervisorProcess, write_config


class NotifySocket:
    """What systemd listens on: a unix datagram socket; `messages` is every datagram
    received so far, each as a dict of its fields."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.messages: list[dict[str, str]] = []

    def read(self) -> list[dict[str, str]]:
        while True:
            try:
                data = self.sock.recv(4096).decode()
            except BlockingIOError:
                return self.messages
            self.messages.append(dict(line.split("=", 1) for line in data.splitlines()))

    def wait(self, predicate, message: str, start: int = 0, timeout: float = 20.0) -> int:
        """Index of the first message from `start` on that satisfies `predicate`."""
        def find():
            for i, m in enumerate(self.read()[start:], start):
                if predicate(m):
                    return i + 1  # truthy even for message 0
            return None
        return int(wait_for(find, timeout=timeout, message=message)) - 1

    def close(self) -> None:
        self.sock.close()


@pytest.mark.timeout(90)
def test_ready_while_redis_is_down_then_serving_and_reload_brackets(tmp_path):
    port = free_port()
    notify = NotifySocket(tmp_path / "notify.sock")
    config = write_config(tmp_path / "forq.toml", f"redis://127.0.0.1:{port}/0", {"q": 1})
    sup = SupervisorProcess(config, env={"NOTIFY_SOCKET": notify.path,
                                         "WATCHDOG_USEC": "400000"})
    server = RedisServer(port)
    try:
        sup.start(wait_ready=False)
        # READY=1 although Redis is down: config loaded, fork server up
        i = notify.wait(lambda m: m.get("READY") == "1", "READY=1 while Redis is down")
        assert notify.messages[i]["STATUS"] == f"waiting for Redis at 127.0.0.1:{port}/0"
        assert f"redis at 127.0.0.1:{port}/0 (from [redis].url in {config})" in sup.log()
        # the watchdog is fed while it waits: two pings at 0.2 s after READY
        notify.wait(lambda m: m.get("WATCHDOG") == "1", "a watchdog ping", start=i)
        j = notify.wait(lambda m: m.get("WATCHDOG") == "1", "a second ping", start=i + 2)
        assert not any("READY" in m for m in notify.messages[i + 1:j])
        assert sup.proc.poll() is None

        server.start()
        k = notify.wait(lambda m: m.get("READY") == "1", "READY=1 once serving", start=i + 1)
        assert notify.messages[k]["STATUS"] == "running: 0/1 busy"
        q = Queue("q", redis=connect(server.url))
        assert q.enqueue("tests.echo", 1).wait(timeout=20) == {"args": [1], "kwargs": {}}

        # a good reload, then a bad one: RELOADING=1 with the monotonic clock, READY=1 after
        for text, said in ((config.read_text().replace("concurrency = 1", "concurrency = 2"),
                            "reloaded"), ("[supervisor\n", "reload refused")):
            config.write_text(text)
            before = time.monotonic_ns() // 1000
            start = len(notify.read())
            sup.signal(signal.SIGHUP)
            r = notify.wait(lambda m: m.get("RELOADING") == "1", "RELOADING=1", start=start)
            assert before <= int(notify.messages[r]["MONOTONIC_USEC"]) <= time.monotonic_ns() // 1000
            notify.wait(lambda m: m.get("READY") == "1", "READY=1 after the reload", start=r)
            wait_for(lambda s=said: s in sup.log(), message=said)
        assert notify.messages[-1].get("STATUS", "running: 0/2 busy") == "running: 0/2 busy"
        assert sup.proc.poll() is None
        sup.signal(signal.SIGTERM)
        assert sup.wait(timeout=20) == 0
        assert "Traceback" not in sup.log()
    finally:
        sup.kill()
        server.stop()
        notify.close()


@pytest.mark.timeout(60)
def test_stop_while_waiting_for_redis_exits_0(tmp_path):
    config = write_config(tmp_path / "forq.toml", f"redis://127.0.0.1:{free_port()}/0",
                          {"q": 1})
    sup = SupervisorProcess(config).start(wait_ready=False)
    try:
        wait_for(lambda: "redis not reachable yet" in sup.log(), message="waiting for Redis")
        sup.signal(signal.SIGTERM)
        assert sup.wait(timeout=20) == 0
        assert "stopped" in sup.log() and "Traceback" not in sup.log()
    finally:
        sup.kill()


@pytest.mark.timeout(60)
def test_waiting_for_redis_backs_off_and_says_so_once(tmp_path):
    """A "Redis" that takes each connection and hangs up: the supervisor tries again
    after 0.1, 0.2, 0.4 s … (each try a connection), and says it waits once, not at
    every try or at every wake-up of its loop."""
    listener = socket.create_server(("127.0.0.1", 0))
    tries: list[float] = []

    def hang_up() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            tries.append(time.monotonic())
            conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    port = listener.getsockname()[1]
    config = write_config(tmp_path / "forq.toml", f"redis://127.0.0.1:{port}/0", {"q": 1})
    sup = SupervisorProcess(config).start(wait_ready=False)
    try:
        wait_for(lambda: len(tries) >= 4, timeout=30, message="four tries to connect")
        gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
        assert all(gap > 0.05 for gap in gaps), gaps  # backed off, never a hot loop
        assert sup.log().count("redis not reachable yet") == 1, sup.log()
        sup.signal(signal.SIGTERM)
        assert sup.wait(timeout=20) == 0
    finally:
        sup.kill()
        listener.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("source", ["FORQ_REDIS_URL", "--redis"])
def test_start_up_line_says_where_the_redis_url_came_from(tmp_path, redis_url, source):
    """The config names a Redis that is not there; the override is used, and said."""
    config = write_config(tmp_path / "forq.toml", "redis://127.0.0.1:1/0", {"q": 1})
    env, command = {}, [sys.executable, "-m", "forq.supervisor.cli"]
    if source == "FORQ_REDIS_URL":
        env["FORQ_REDIS_URL"] = redis_url
    else:
        command += ["--redis", redis_url.replace("redis://", "redis://:secret@")]
    with SupervisorProcess(config, env=env, command=command) as sup:
        endpoint = redis_url.split("//", 1)[1]
        assert f"redis at {endpoint} (from {source})" in sup.log(), sup.log()
        assert "secret" not in sup.log()


def test_a_bad_redis_flag_is_one_line_and_exit_2(tmp_path):
    config = write_config(tmp_path / "forq.toml", "redis://127.0.0.1:1/0", {"q": 1})
    sup = SupervisorProcess(config, command=[sys.executable, "-m", "forq.supervisor.cli",
                                             "--redis", "http://nowhere"])
    sup.start(wait_ready=False)
    assert sup.wait(timeout=20) == 2
    assert sup.log().startswith('forq: --redis: expected a URL such as "redis://'), sup.log()
    assert len(sup.log().splitlines()) == 1
