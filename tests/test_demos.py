"""`make demo` and `make web` stop everything they started when they are stopped: a real
SIGTERM to the demo (``kill``), or a terminal's Ctrl-C (SIGINT to its whole process
group), while its private Redis, supervisors (with their fork servers) and web server
run; afterwards no process it started is left. Their output in a pipe has no escape
sequences.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from forq.testing.redis import free_port
from forq.testing.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]


class Demo:
    """A demo in a session of its own (as a shell runs a job), its output collected."""

    def __init__(self, *argv: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT),
                   FORQ_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")  # none: a private one
        env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen([sys.executable, "-m", *argv], env=env, cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.out = b""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            self.out += chunk

    def text(self) -> str:
        return self.out.decode(errors="replace")

    def started(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        for proc in [*self.started(), psutil.Process(self.proc.pid)]:
            try:
                proc.kill()
            except psutil.Error:
                pass
        self.proc.wait(timeout=10)


def _titles(procs: list[psutil.Process]) -> list[str]:
    titles = []
    for proc in procs:
        try:
            titles.append(" ".join(proc.cmdline()))
        except psutil.Error:
            pass
    return titles


def _alive(procs: list[psutil.Process]) -> list[str]:
    left = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{proc.pid} {' '.join(proc.cmdline())}")
        except psutil.Error:
            pass
    return left


def _stop_and_check(demo: Demo, expected: dict[str, int], said: str, how: str) -> None:
    """Wait until the demo said `said` and runs every process of `expected` (a piece of
    the command line → how many), stop it by `how`, then check it exited and left none
    behind."""
    def everything() -> list[psutil.Process] | None:
        if said not in demo.text():
            assert demo.proc.poll() is None, demo.text()
            return None
        started = demo.started()
        titles = _titles(started)
        if all(sum(piece in t for t in titles) >= n for piece, n in expected.items()):
            return started
        assert demo.proc.poll() is None, demo.text()
        return None

    started: list[psutil.Process] = []
    try:
        started = wait_for(everything, timeout=90, interval=0.1,
                           message=f"the demo's processes {expected}")
        if how == "SIGTERM":
            demo.proc.send_signal(signal.SIGTERM)
        else:  # a terminal's Ctrl-C: SIGINT to the foreground process group
            os.killpg(demo.proc.pid, signal.SIGINT)
        demo.proc.wait(timeout=60)
        wait_for(lambda: not _alive(started), timeout=15, interval=0.05,
                 message=f"the demo's processes to end: {_alive(started)}")
        demo.reader.join(timeout=10)
    finally:
        if demo.proc.poll() is None:
            demo.kill()
        for proc in started:  # a failed check leaves nothing running either
            try:
                proc.kill()
            except psutil.Error:
                pass
    out = demo.text()
    assert "Traceback" not in out, out
    assert "\x1b" not in out, out  # a pipe: no escape sequences
    assert f"==> {how}: stopping" in out, out


@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
def test_make_demo_stops_what_it_started(how):
    demo = Demo("forq.supervisor.cli.demo")
    _stop_and_check(demo, {"redis-server": 1, "forq: supervisor": 1, "forq: fork server": 1},
                    "enqueueing the example jobs", how)
    assert demo.proc.returncode == 128 + signal.Signals[how].value
    assert "the supervisor and Redis the demo started" in demo.text()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
def test_make_web_stops_what_it_started(how):
    pytest.importorskip("uvicorn", reason="forq web needs the web extra")
    demo = Demo("forq.web.demo", "--port", str(free_port()), "--rate", "20")
    _stop_and_check(demo, {"redis-server": 1, "forq: supervisor": 2, "forq: fork server": 2,
                           "forq.supervisor.cli web": 1}, "dashboard at http://", how)
    assert demo.proc.returncode == 0  # Ctrl-C is how `make web` ends
