"""A venv that processes running as another user can use: for tests of `[sandbox].run_as`.

A job (and the fork server) running as `nobody` must read the interpreter, the standard
library and forq's dependencies. A Python under /root (mode 0700), as on our own
machines, is unreadable to it, and so is anything under a private /tmp. This builds,
once per checkout and pyproject.toml, a venv of Debian's /usr/bin/python3 under /opt
with forq installed in editable mode from the checkout (which must be world-readable).

    python -m forq.testing.system_python CHECKOUT     # prints the venv's python
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SYSTEM_PYTHON = "/usr/bin/python3"
ROOT = Path(os.environ.get("FORQ_SYSTEM_VENVS", "/opt/forq-test"))


class Unavailable(RuntimeError):
    """No system Python, or the venv could not be built (the reason says which)."""


def venv_python(checkout: str | os.PathLike[str]) -> Path:
    """The python of a world-readable venv with forq (from `checkout`) installed."""
    checkout = Path(checkout).resolve()
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        raise Unavailable(f"{SYSTEM_PYTHON} missing (apt-get install python3 python3-venv)")
    digest = hashlib.sha256(str(checkout).encode() + b"\0"
                            + (checkout / "pyproject.toml").read_bytes()).hexdigest()[:16]
    venv = ROOT / f"venv-{digest}"
    python = venv / "bin" / "python"
    if (venv / "ready").exists():
        return python
    ROOT.mkdir(parents=True, exist_ok=True)
    os.chmod(ROOT, 0o755)
    build = Path(f"{venv}.partial.{os.getpid()}")
    shutil.rmtree(build, ignore_errors=True)
    try:
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(build)], check=True,
                       capture_output=True, timeout=300)
        subprocess.run([str(build / "bin" / "pip"), "install", "--quiet",
                        "--disable-pip-version-check", "-e", str(checkout)],
                       check=True, capture_output=True, cwd="/", timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(build, ignore_errors=True)
        err = getattr(exc, "stderr", b"") or b""
        raise Unavailable(f"building {venv} failed: {err.decode(errors='replace')[-2000:]}") from None
    subprocess.run(["chmod", "-R", "a+rX", str(build)], check=True)
    (build / "ready").write_text("")
    try:
        build.rename(venv)
    except OSError:  # another process built it meanwhile
        shutil.rmtree(build, ignore_errors=True)
    return python


if __name__ == "__main__":
    print(venv_python(sys.argv[1] if len(sys.argv) > 1 else "."))
