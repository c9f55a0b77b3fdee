"""Type-check forq as it installs: ``python -m tests.typecheck [mypy options]``.

`make` installs forq editable in setuptools' strict mode (tests/layout.py), so the
venv's site-packages leads to the installed layout (forq/ → jobs/, forq/supervisor/ →
supervisor/, …) in links to the repository's files, and mypy finds `forq` there as a
user's checker would. This runs ``mypy -p forq`` and prints each finding with the
repository's own path (the file the link points to), e.g. web/demo.py, not
build/__editable__.forq-…/forq/web/demo.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests import layout

REPO = layout.REPO
FINDING = re.compile(r"^(?P<path>[^\s:][^:\n]*\.pyi?)(?=:)", re.MULTILINE)


def repository_paths(output: str) -> str:
    """mypy's output with each file named by the repository path its link points to."""
    def real(match: re.Match[str]) -> str:
        path = Path(os.path.realpath(match["path"]))
        return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else match["path"]

    return FINDING.sub(real, output)


def install_problem() -> str:
    """Why mypy would not see this repository's files as `forq` ("" when it would)."""
    if layout.link_tree() is None:
        return ("forq is not installed in setuptools' strict editable mode, so mypy cannot "
                f"follow it to the repository's folders: run `{layout.RELINK}`")
    return layout.stale_message()


def main(argv: list[str]) -> int:
    problem = install_problem()
    if problem:
        print(f"tests.typecheck: {problem}", file=sys.stderr)
        return 2
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                           str(REPO / "pyproject.toml"), "--cache-dir",
                           str(REPO / "build" / "mypy-cache"), *argv, "-p", "forq"],
                          cwd=REPO, capture_output=True, text=True)
    print(repository_paths(proc.stdout + proc.stderr), end="")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
