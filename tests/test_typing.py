"""Type checking as a user's checker sees forq: `py.typed` ships, mypy follows `forq.*` to
the repository's folders (the strict editable install, tests/layout.py), and mypy
--strict (the `[tool.mypy]` of pyproject.toml) is clean on the public API and the
examples.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import layout
from tests.typecheck import install_problem, repository_paths

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = [p for p in sorted((REPO / "examples").glob("*")) if p.is_dir()] \
    if (REPO / "examples").is_dir() else []


def mypy(args: list[str], cwd: Path, cache: Path, env: dict[str, str] | None = None,
         ) -> subprocess.CompletedProcess[str]:
    problem = install_problem()
    if problem:
        pytest.fail(problem)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
         "--cache-dir", str(cache), *args],
        cwd=cwd, capture_output=True, text=True, timeout=280, env=dict(os.environ, **(env or {})))


def test_the_package_says_it_is_typed():
    from importlib import resources

    assert (resources.files("forq") / "py.typed").is_file()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", ["forq", *(p.name for p in EXAMPLES)])
def test_mypy_strict(tmp_path_factory, target):
    """The public API (`forq`: every module of jobs/, forq.store's too), and each example
    app as its own program, with forq found where pip installed it."""
    pytest.importorskip("mypy", reason="mypy comes with the test extra")
    cache = tmp_path_factory.getbasetemp() / "mypy-cache"
    if target == "forq":
        jobs = layout.package_dirs()["forq"]  # jobs/ and its subpackages (forq.store)
        modules = sorted(f"{package}.{p.stem}".removesuffix(".__init__")
                         for package, folder in layout.package_dirs().items()
                         if folder.is_relative_to(jobs) for p in folder.glob("*.py"))
        assert {"forq", "forq.queue", "forq.store.scripts"} <= set(modules), modules
        args = [arg for m in modules for arg in ("-m", m)]
        proc = mypy(["--strict", *args], tmp_path_factory.mktemp("api"), cache)
    else:
        example = REPO / "examples" / target
        proc = mypy(["--strict", "."], example, cache, env={"MYPYPATH": str(example)})
    assert proc.returncode == 0, repository_paths(proc.stdout[-6000:] + proc.stderr[-2000:])


@pytest.mark.timeout(300)
def test_mypy_follows_forq_to_the_repositorys_files(tmp_path):
    """A program outside the repository: every `forq.*` it imports resolves, to the
    repository's file installed under that name (mypy's log names each file it parses),
    and a wrong call into forq.supervisor is found."""
    pytest.importorskip("mypy", reason="mypy comes with the test extra")
    (tmp_path / "probe.py").write_text(
        "import forq.lua\n"
        "import forq.testing.waiting\n"
        "import forq.web.demo\n"
        "from forq.supervisor.cli.enqueue import cmd_enqueue\n"
        "from forq.supervisor.loop.eventloop import *  # noqa\n"
        "cmd_enqueue(bogus=2)\n")
    proc = mypy(["-v", "probe.py"], tmp_path, tmp_path / "cache", env={"MYPYPATH": ""})
    findings, out = proc.stdout, proc.stdout + proc.stderr  # the log is on stderr
    assert "import-not-found" not in findings and "import-untyped" not in findings, findings
    assert findings.startswith('probe.py:6: error: Unexpected keyword argument "bogus" for '
                               '"cmd_enqueue"'), findings
    parsed = dict(re.findall(r"^LOG:  Parsing (\S+) \((forq(?:\.\w+)*)\)$", out, re.MULTILINE))
    files = layout.installed_files()
    for module in ("forq.lua", "forq.testing.waiting", "forq.web.demo", "forq.supervisor.cli.enqueue",
                   "forq.supervisor.loop.eventloop", "forq.queue"):
        path = next((p for p, m in parsed.items() if m == module), None)
        assert path is not None, f"mypy did not parse {module}: {sorted(parsed.values())}"
        inside = module.replace(".", "/") + ("/__init__.py" if path.endswith("__init__.py")
                                             else ".py")
        assert Path(path).resolve() == files[inside], (module, path)


def test_the_editable_install_says_when_a_file_is_not_linked(tmp_path):
    """tests/layout.py's check (run by `make` before every target, by pytest and by
    tests/typecheck.py): a link tree like setuptools' strict mode makes, then a file
    added to the repository and one removed."""
    files = layout.installed_files()
    assert files["forq/supervisor/loop/eventloop.py"] == REPO / "supervisor/loop/eventloop.py"
    assert files["forq/lua/claim.lua"] == REPO / "lua/claim.lua"
    assert files["forq/py.typed"] == REPO / "jobs/py.typed"
    tree = tmp_path / "tree"
    for inside, source in files.items():
        (tree / inside).parent.mkdir(parents=True, exist_ok=True)
        (tree / inside).symlink_to(source)
    assert layout.stale(tree) == []
    (tree / "forq" / "queue.py").unlink()
    gone = tmp_path / "gone.py"
    gone.write_text("")
    (tree / "forq" / "gone.py").symlink_to(gone)
    gone.unlink()
    assert layout.stale(tree) == ["+ jobs/queue.py", f"- forq/gone.py (links to {gone})"]
