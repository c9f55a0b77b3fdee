"""The sd_notify protocol against real unix datagram sockets (what systemd listens on)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from forq.supervisor.loop.sdnotify import (
    SYSTEMD_ENV_VARS,
    Notifier,
    scrub_child_env,
    scrub_environ,
    watchdog_interval,
)


def _recv_all(sock: socket.socket) -> list[bytes]:
    """Drain every datagram already queued on ``sock``."""
    out = []
    sock.settimeout(1.0)
    out.append(sock.recv(4096))
    sock.setblocking(False)
    while True:
        try:
            out.append(sock.recv(4096))
        except BlockingIOError:
            return out


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    yield path, sock
    sock.close()


def _exercise(notifier: Notifier) -> None:
    assert notifier.enabled
    assert notifier.ready() is True
    assert notifier.status("claiming: 3/8 slots busy") is True
    assert notifier.watchdog() is True
    assert notifier.stopping() is True


EXPECTED = [b"READY=1", b"STATUS=claiming: 3/8 slots busy", b"WATCHDOG=1", b"STOPPING=1"]


def test_messages_in_order_on_path_socket(
    path_socket: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, sock = path_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    with Notifier() as notifier:
        assert notifier.socket_path == path
        _exercise(notifier)
    assert _recv_all(sock) == EXPECTED


def test_messages_in_order_on_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"forq-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        notifier = Notifier.from_env()
        _exercise(notifier)
        notifier.close()
        assert _recv_all(sock) == EXPECTED
    finally:
        sock.close()


def test_notify_fields_one_datagram_and_no_newline_injection(
    path_socket: tuple[str, socket.socket],
) -> None:
    path, sock = path_socket
    notifier = Notifier(path)
    assert notifier.notify(READY=1, status="up\nSTOPPING=1")
    assert notifier.ready("ready: 2 queues")
    assert notifier.send("EXTEND_TIMEOUT_USEC=5000000")
    notifier.close()
    assert _recv_all(sock) == [
        b"READY=1\nSTATUS=up STOPPING=1",
        b"READY=1\nSTATUS=ready: 2 queues",
        b"EXTEND_TIMEOUT_USEC=5000000",
    ]


def test_noop_without_notify_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier()
    assert not notifier.enabled
    assert notifier.ready() is False
    assert notifier.status("x") is False
    assert notifier.watchdog() is False
    assert notifier.stopping() is False
    assert Notifier.from_env({}).enabled is False
    assert Notifier.from_env({"NOTIFY_SOCKET": ""}).enabled is False


def test_send_errors_never_raise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    missing = Notifier(str(tmp_path / "nobody-listens.sock"))
    with caplog.at_level("DEBUG", logger="forq.supervisor.loop.sdnotify"):
        assert missing.ready() is False
        assert missing.watchdog() is False
    assert "sd_notify" in caplog.text
    # The socket comes back after the listener appears (systemd restarted).
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "nobody-listens.sock"))
    try:
        assert missing.watchdog() is True
        assert _recv_all(sock) == [b"WATCHDOG=1"]
    finally:
        sock.close()
        missing.close()


def test_watchdog_interval() -> None:
    me = str(os.getpid())
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": me}) == 15.0
    # Armed for some other process: the variables leaked to us, do not ping.
    other = str(os.getpid() + 1)
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": other}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "x"}) is None


def test_watchdog_interval_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval() == 1.0


def test_scrub_child_env_removes_systemd_vars() -> None:
    env = {
        "PATH": "/usr/bin",
        "FORQ_REDIS_URL": "redis://localhost",
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "WATCHDOG_USEC": "30000000",
        "WATCHDOG_PID": "1234",
        "LISTEN_FDS": "1",
        "LISTEN_PID": "1234",
        "LISTEN_FDNAMES": "metrics",
    }
    original = dict(env)
    clean = scrub_child_env(env)
    assert clean == {"PATH": "/usr/bin", "FORQ_REDIS_URL": "redis://localhost"}
    assert env == original, "input must not be modified"
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID"):
        assert name in SYSTEMD_ENV_VARS


def test_scrub_environ_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "@x")
    monkeypatch.setenv("LISTEN_PID", "1")
    monkeypatch.setenv("FORQ_KEEP", "yes")
    assert "NOTIFY_SOCKET" not in scrub_child_env()
    scrub_environ()
    assert "NOTIFY_SOCKET" not in os.environ
    assert "LISTEN_PID" not in os.environ
    assert os.environ["FORQ_KEEP"] == "yes"
