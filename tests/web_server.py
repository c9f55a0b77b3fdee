"""Run a real `forq web` process for tests, and a headless Chromium to look at it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from forq.testing.waiting import stop_process
from tests.helpers import wait_for
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]


class WebProcess:
    """`forq web --redis URL --listen 127.0.0.1:PORT [args]` in its own process."""

    def __init__(self, redis_url: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["--redis", redis_url, "--listen", f"127.0.0.1:{self.port}",
                     "--refresh", "200ms", *args]
        self.env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
        self.log_path = Path(tempfile.mkstemp(prefix="forq-web-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None

    def start(self) -> WebProcess:
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "forq.supervisor.cli", "web", *self.args],
            stdout=self._log, stderr=subprocess.STDOUT, env=self.env, cwd=str(REPO))
        wait_for(lambda: self._answers() or self.proc.poll() is not None, timeout=20,
                 interval=0.05, message="forq web answering")
        assert self.proc.poll() is None, f"forq web exited:\n{self.log()}"
        return self

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(f"{self.url}/static/forq.css", timeout=1).close()
            return True
        except urllib.error.HTTPError:
            return True  # it answered (401 with auth on)
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()

    def __enter__(self) -> WebProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_chromium(playwright, user_data_dir: str):
    """Debian's chromium, headless, never a downloaded browser; a fresh profile."""
    return playwright.chromium.launch_persistent_context(
        user_data_dir, executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
