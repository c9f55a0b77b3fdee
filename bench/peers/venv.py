"""The peers' own venv, bench/.venv-peers: made on first use, reused afterwards.

rq, celery[redis], dramatiq[redis] and arq come from PyPI with pip; psutil for the driver,
py-spy to profile forq's supervisor; Django, pandas and numpy for the application-size
benchmark's real import set (`bench/apps/real.py`: forq's fork server finds them here too,
never in the tests' venv). A stamp file holds the requirement list, so a
change of it reinstalls.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

VENV = Path(__file__).resolve().parent.parent / ".venv-peers"
REQUIREMENTS = ["rq", "celery[redis]", "dramatiq[redis]", "arq", "psutil", "py-spy", "django",
                "pandas", "numpy"]
STAMP = VENV / ".bench-installed"


def python() -> Path:
    return VENV / "bin" / "python"


def ensure(log=print) -> Path:
    want = json.dumps(REQUIREMENTS)
    if python().exists() and STAMP.exists() and STAMP.read_text() == want:
        return python()
    if not python().exists():
        log(f"creating the peers' venv at {VENV} ...")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    log(f"installing {' '.join(REQUIREMENTS)} into {VENV} (pip) ...")
    subprocess.run([str(python()), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
                   check=True)
    subprocess.run([str(python()), "-m", "pip", "install", "--quiet", *REQUIREMENTS], check=True)
    STAMP.write_text(want)
    return python()


def versions() -> dict[str, str]:
    code = ("import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
            "('rq', 'celery', 'kombu', 'billiard', 'dramatiq', 'arq', 'redis', 'django', 'pandas', 'numpy')}))")
    out = subprocess.run([str(python()), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


BULLMQ = Path(__file__).resolve().parent / "bullmq"


def ensure_node(log=print) -> bool:
    """BullMQ for the ceiling benchmark: `npm ci` from the committed lockfile on first
    use. False (and a log line) when this machine has no node or npm."""
    if (BULLMQ / "node_modules" / "bullmq").exists():
        return True
    if not (shutil.which("node") and shutil.which("npm")):
        log("no node/npm on this machine: the ceiling benchmark runs without BullMQ")
        return False
    log(f"installing BullMQ into {BULLMQ} (npm ci) ...")
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=str(BULLMQ), check=True,
                   stdout=subprocess.DEVNULL)
    return True


def bullmq_version() -> str | None:
    try:
        return json.loads((BULLMQ / "node_modules" / "bullmq" / "package.json").read_text())[
            "version"]
    except OSError:
        return None
