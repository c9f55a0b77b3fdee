"""The installed package works on its own: build the wheel, install it into a fresh
virtualenv, and from a directory outside the repository enqueue and claim a job on the
test Redis. This proves the Lua scripts ship inside the wheel and are found from the
installed copy, not from a source checkout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from forq.store.scripts import TRANSITIONS
from tests.layout import folders, installed_files

REPO = Path(__file__).resolve().parent.parent

# Signs that a step failed only because this machine cannot reach a package index.
OFFLINE = ("NewConnectionError", "Temporary failure in name resolution",
           "Network is unreachable", "Failed to establish a new connection", "ProxyError",
           "Could not fetch URL", "No route to host")

CHILD = textwrap.dedent("""
    import json, sys
    import forq
    import forq.store.scripts
    from forq import Queue
    from forq.supervisor.leases.calls import leasing

    url, name = sys.argv[1], sys.argv[2]
    q = Queue(name, url=url)
    # keep_history: the whole record stays once it succeeded (the default keeps a compact
    # one, without its arguments), so the test can read them back
    handle = q.enqueue("wheel.check", 41, kwargs={"plus": 1}, keep_history=True)
    claimed = leasing(q).claim("wheel-test", 5, 60000)
    lease = claimed.leases[0]
    reply = leasing(q).ack(lease.id, lease.token, json.dumps(42))
    print(json.dumps({
        "lua_dir": str(forq.store.scripts._lua_dir()),
        "forq_file": forq.__file__,
        "top_level": sorted(d.name for d in __import__("pathlib").Path(forq.__file__).parent.parent.iterdir()
                            if d.name in ("jobs", "supervisor", "forq_lua", "lua", "testing", "forq")),
        "enqueued": handle.id,
        "claimed": [l.id for l in claimed.leases],
        "args": lease.job.args,
        "ack": reply,
        "sys_path": sys.path,
    }))
""")


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _skip_if_offline(proc: subprocess.CompletedProcess, step: str) -> None:
    output = proc.stdout + proc.stderr
    if proc.returncode != 0 and any(sign in output for sign in OFFLINE):
        pytest.skip(f"{step} needs a package index, and none is reachable:\n{output[-2000:]}")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


SKIP_DIRS = {".git", "build", "dist", "__pycache__", ".ruff_cache", ".pytest_cache",
             "tests", "bench", "chaos"}


def _ignore(directory: str, names: list[str]) -> set[str]:
    """What the build does not need: caches, tests, benchmarks, and any virtualenv."""
    skipped = set()
    for name in names:
        path = Path(directory, name)
        if (name in SKIP_DIRS or name.endswith((".egg-info", ".pyc"))
                or (path.is_dir() and (path / "pyvenv.cfg").exists())):
            skipped.add(name)
    return skipped


def _copy_source(dest: Path) -> Path:
    """Build from a copy, so the build leaves no build/ or egg-info in the checkout."""
    shutil.copytree(REPO, dest, ignore=_ignore, symlinks=True)
    return dest


def _build_wheel(src: Path, outdir: Path, cwd: Path) -> Path:
    if importlib.util.find_spec("build") is None:
        pytest.skip("the 'build' package is not installed (pip install -e '.[test]')")
    # an isolated build fetches setuptools and wheel from the index ...
    proc = _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(outdir), str(src)],
                cwd=cwd, env=_clean_env())
    if proc.returncode != 0 and any(s in proc.stdout + proc.stderr for s in OFFLINE):
        # ... and offline, the build tools already installed here must do
        proc = _run([sys.executable, "-m", "build", "--wheel", "--no-isolation",
                     "--outdir", str(outdir), str(src)], cwd=cwd, env=_clean_env())
        if proc.returncode != 0:
            pytest.skip("cannot build a wheel offline: no package index, and the "
                        f"installed build tools are not enough:\n{proc.stderr[-2000:]}")
    assert proc.returncode == 0, f"wheel build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    wheels = sorted(outdir.glob("forq-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.timeout(300)
def test_installed_wheel_enqueues_and_claims_outside_the_repo(tmp_path, redis_url, queue, r):
    wheel = _build_wheel(_copy_source(tmp_path / "src"), tmp_path / "dist", tmp_path)

    names = set(zipfile.ZipFile(wheel).namelist())
    includes = [f"includes/{path.stem}" for path in (REPO / "lua" / "includes").glob("*.lua")]
    assert includes, "lua/includes/ is empty"
    for script in (*TRANSITIONS, *includes):
        assert f"forq/lua/{script}.lua" in names, f"{script}.lua is missing from the wheel"
    # every module of every folder that installs (pyproject.toml's package-dir) is in it
    for package, folder in folders().items():
        for path in (REPO / folder).rglob("*.py"):
            inside = f"{package}/{path.relative_to(REPO / folder)}"
            assert inside in names, f"{inside} is missing from the wheel"
    # and nothing else: exactly what the editable install links (tests/layout.py)
    assert {n for n in names if ".dist-info/" not in n} == set(installed_files())
    assert "forq/py.typed" in names, "PEP 561: type checkers read forq's annotations"
    # the dashboard's templates and static files are package data
    for folder in ("templates", "static"):
        for path in (REPO / "web" / folder).iterdir():
            assert f"forq/web/{folder}/{path.name}" in names, f"web/{folder}/{path.name} missing"
    # one import name: nothing installed as a top-level `jobs`, `supervisor` or `forq_lua`
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == {"forq"}, f"the wheel installs top-level packages {sorted(top)}"

    venv = tmp_path / "venv"
    proc = _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, env=_clean_env())
    assert proc.returncode == 0, proc.stderr
    python = venv / "bin" / "python"
    proc = _run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                 str(wheel)], cwd=tmp_path, env=_clean_env())
    _skip_if_offline(proc, "installing the wheel's dependencies")
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert (venv / "bin" / "forq").exists(), "the forq console script was not installed"

    (tmp_path / "child.py").write_text(CHILD)
    proc = _run([str(python), "child.py", redis_url, queue.name], cwd=tmp_path,
                env=_clean_env(), timeout=60)
    assert proc.returncode == 0, f"installed copy failed:\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])

    venv_dir = venv.resolve()
    lua_dir = Path(report["lua_dir"]).resolve()
    assert lua_dir.is_relative_to(venv_dir), f"Lua scripts loaded from {lua_dir}, not the venv"
    assert not lua_dir.is_relative_to(REPO)
    forq_file = Path(report["forq_file"]).resolve()
    assert forq_file.is_relative_to(venv_dir), f"forq imported from {forq_file}"
    assert report["top_level"] == ["forq"], report["top_level"]
    assert str(REPO) not in report["sys_path"]

    assert report["claimed"] == [report["enqueued"]]
    assert report["args"] == [41]
    assert report["ack"] == "ok"
    # and the job the installed copy handled is really in the test Redis, succeeded
    job = queue.get(report["enqueued"])
    assert job.state == "succeeded" and job.result == 42
    assert job.kwargs == {"plus": 1}
    assert [e["event"] for e in job.history] == ["enqueued", "claimed", "succeeded"]
