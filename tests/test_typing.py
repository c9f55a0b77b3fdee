"""Type checking as a user's checker sees forq: `py.typed` ships, and mypy --strict
(the `[tool.mypy]` of pyproject.toml) is clean on the public API and the examples.

mypy cannot follow the folder-to-package mapping of pyproject.toml, so the check runs on
a link tree laid out as installed (``forq`` → jobs/).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = [p for p in sorted((REPO / "examples").glob("*")) if p.is_dir()] \
    if (REPO / "examples").is_dir() else []


def test_the_package_says_it_is_typed():
    from importlib import resources

    assert (resources.files("forq") / "py.typed").is_file()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", ["forq", *(p.name for p in EXAMPLES)])
def test_mypy_strict(tmp_path_factory, target):
    """The public API (`forq`), and each example app as its own program."""
    pytest.importorskip("mypy", reason="mypy comes with the test extra")
    base = tmp_path_factory.getbasetemp() / "mypy"
    tree = base / "tree"
    if not tree.exists():
        tree.mkdir(parents=True)
        (tree / "forq").symlink_to(REPO / "jobs")
    if target == "forq":
        cwd, args, path = tree, ["-p", "forq"], str(tree)
    else:
        example = REPO / "examples" / target
        cwd, args, path = example, ["."], f"{example}{os.pathsep}{tree}"
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--config-file", str(REPO / "pyproject.toml"),
         "--cache-dir", str(base / "cache"), *args],
        cwd=cwd, capture_output=True, text=True, timeout=280, env=dict(os.environ, MYPYPATH=path))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
