"""The CLI on a real terminal (a pseudo-terminal): rich tables, a live `--watch` view
and progress bars; in a pipe the same commands print the plain text scripts parse
(tests/test_cli.py checks that text)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]
OWNER = "terminal-test:1"


def _on_tty(redis_url: str, *args: str, env: dict[str, str] | None = None,
            ) -> tuple[subprocess.Popen[bytes], int]:
    """`forq ARGS` with stdout and stderr on a pseudo-terminal; returns it and the
    terminal's master end."""
    master, slave = pty.openpty()
    base = dict(os.environ, PYTHONPATH=str(ROOT), FORQ_REDIS_URL=redis_url,
                TERM="xterm-256color", COLUMNS="120", LINES="40")
    base.pop("NO_COLOR", None)
    env = dict(base, **(env or {}))
    proc = subprocess.Popen([sys.executable, "-m", "forq.supervisor.cli", *args], env=env,
                            cwd=ROOT, stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    return proc, master


def _read(master: int, until: float) -> bytes:
    out = b""
    while time.monotonic() < until:
        ready, _, _ = select.select([master], [], [], 0.05)
        if not ready:
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        out += chunk
    return out


def _run(redis_url: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc, master = _on_tty(redis_url, *args, env=env)
    try:
        out = _read(master, time.monotonic() + 20)
        return proc.wait(timeout=20), out.decode(errors="replace")
    finally:
        os.close(master)
        proc.kill()


def _visible(text: str) -> str:
    """What the terminal shows: the text without its escape sequences."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def _dead(queue, n: int) -> None:
    queue.enqueue_many([{"task": "tests.fails", "args": [i]} for i in range(n)])
    for lease in leasing(queue).claim(OWNER, n, 60_000).leases:
        leasing(queue).fail(lease.id, lease.token, {"message": "boom"}, mode="fatal")


def test_tables_are_drawn_on_a_terminal(redis_url, queue):
    _dead(queue, 2)
    queue.enqueue("examples.add")
    code, out = _run(redis_url, "stats", "-q", queue.name)
    assert code == 0, out
    assert "─" in out and "\x1b[" in out, out  # a rich table, with styles
    header = next(line for line in _visible(out).splitlines() if "pending" in line)
    assert header.split()[:3] == ["queue", "pending", "scheduled"]
    assert queue.name in out
    code, out = _run(redis_url, "dead", "list", "-q", queue.name)
    assert code == 0 and "─" in out and out.count("boom") == 2, out


@pytest.mark.timeout(30)
def test_watch_is_a_live_view_until_ctrl_c(redis_url, queue):
    queue.enqueue("examples.add")
    proc, master = _on_tty(redis_url, "stats", "--watch", "-q", queue.name, "--interval", "50ms")
    seen = b""
    try:
        def redrawn() -> bool:
            nonlocal seen
            seen += _read(master, time.monotonic() + 0.2)
            return seen.count(b"Ctrl-C to stop") >= 3
        wait_for(redrawn, timeout=15, message="three frames of the live view")
        queue.enqueue("examples.add")  # the next frames show the new count
        wait_for(lambda: redrawn() and b"\x1b[" in seen, timeout=5)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        os.close(master)
        proc.kill()
    text = seen.decode(errors="replace")
    assert "\x1b[2K" in text or "\x1b[1A" in text  # redrawn in place, not scrolled
    assert "Traceback" not in text


@pytest.mark.timeout(60)
def test_purging_all_dead_jobs_shows_progress(redis_url, queue):
    _dead(queue, 120)
    code, out = _run(redis_url, "dead", "purge", "-q", queue.name, "--all")
    assert code == 0, out
    assert f"purge dead jobs of {queue.name}" in out  # the bar, on stderr
    assert f"purged 120 dead jobs of queue {queue.name}" in out
    assert queue.stats()["dead"] == 0


def test_a_pipe_gets_plain_text(redis_url, queue):
    queue.enqueue("examples.add")
    out = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "stats", "-q",
                          queue.name], env=dict(os.environ, PYTHONPATH=str(ROOT),
                                                FORQ_REDIS_URL=redis_url, TERM="xterm"),
                         cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "\x1b" not in out.stdout and "─" not in out.stdout
    assert out.stdout.splitlines()[1].split()[:2] == [queue.name, "1"]


@pytest.mark.timeout(60)
def test_no_color_on_a_terminal_is_plain_text_without_escapes(redis_url, queue):
    """NO_COLOR (https://no-color.org): the plain text of a pipe, even on a terminal: no
    colour, no box drawing, no cursor movement, no progress bar."""
    _dead(queue, 3)
    code, out = _run(redis_url, "stats", "-q", queue.name, env={"NO_COLOR": "1"})
    assert code == 0 and "\x1b" not in out and "─" not in out, out
    assert out.splitlines()[1].split()[:5] == [queue.name, "0", "0", "0", "3"]
    code, out = _run(redis_url, "dead", "purge", "-q", queue.name, "--all", env={"NO_COLOR": "1"})
    assert code == 0 and "\x1b" not in out and "purge dead jobs of" not in out, out
    assert f"purged 3 dead jobs of queue {queue.name}" in out
    proc, master = _on_tty(redis_url, "stats", "--watch", "-q", queue.name, "--interval", "50ms",
                           env={"NO_COLOR": "1"})
    seen = b""
    try:
        def frames() -> bool:
            nonlocal seen
            seen += _read(master, time.monotonic() + 0.2)
            return seen.count(b"Ctrl-C to stop") >= 2
        wait_for(frames, timeout=15, message="two frames of the watch")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        os.close(master)
        proc.kill()
    assert b"\x1b" not in seen, seen[-2000:]
    # an empty NO_COLOR is not set (no-color.org): rich as usual
    code, out = _run(redis_url, "stats", "-q", queue.name, env={"NO_COLOR": ""})
    assert code == 0 and "\x1b[" in out and "─" in out, out
