"""Type-check forq as it installs: ``python -m tests.typecheck [mypy options]``.

The repository's folders install under other names (jobs/ is `forq`, supervisor/ is
`forq.supervisor`, …: pyproject.toml's package-dir), and mypy cannot follow the
import hook of an editable install. So this builds the installed layout out of
symlinks under build/typecheck/, runs mypy on it, and prints the findings with the
repository's own paths.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGE = REPO / "build" / "typecheck"
# the installed package → the folder it comes from (pyproject.toml's package-dir)
LAYOUT = {"forq": "jobs", "forq/supervisor": "supervisor", "forq/lua": "lua",
          "forq/testing": "testing"}
EXTRA_PACKAGES = ("web",)  # optional sub-packages, mapped the same way when present


def stage() -> Path:
    shutil.rmtree(STAGE, ignore_errors=True)
    layout = dict(LAYOUT)
    for name in EXTRA_PACKAGES:
        if (REPO / name / "__init__.py").exists():
            layout[f"forq/{name}"] = name
    for target, source in layout.items():
        dest = STAGE / target
        dest.mkdir(parents=True, exist_ok=True)
        for path in (REPO / source).rglob("*.py"):
            link = dest / path.relative_to(REPO / source)
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(path, link)
    (STAGE / "forq" / "py.typed").touch()
    return STAGE


def main(argv: list[str]) -> int:
    root = stage()
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                           str(REPO / "pyproject.toml"), "--cache-dir",
                           str(REPO / "build" / "mypy-cache"), *argv, "forq"], cwd=root,
                          capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    for target, source in sorted(LAYOUT.items(), key=lambda kv: -len(kv[0])):
        out = out.replace(f"{target}/", f"{source}/")
    print(out, end="")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
