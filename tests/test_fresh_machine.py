"""A machine without redis-server: `make demo` and `make test` stop with one line that
names the package to install (docs/getting-started.md, "Redis on a fresh machine"), never a traceback."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv", [["-m", "forq.testing.redis", "--", "true"],
                                  ["-m", "forq.supervisor.cli.demo"]], ids=["make test", "make demo"])
def test_no_redis_server_is_one_line_naming_the_package(tmp_path, argv):
    import subprocess

    bin_dir = tmp_path / "bin"  # a PATH with python and nothing else
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = dict(os.environ, PATH=str(bin_dir), PYTHONPATH=str(ROOT),
               FORQ_REDIS_URL="redis://127.0.0.1:1/0")  # nothing listens on port 1
    proc = subprocess.run([sys.executable, *argv], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "apt-get install redis-server" in lines[0] and "Traceback" not in proc.stderr
