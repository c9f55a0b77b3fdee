"""forq's installed layout, read from pyproject.toml, and whether this venv's editable
install still matches the repository's files.

The folders install under other names (jobs/ is `forq`, supervisor/ is
`forq.supervisor`, …: `[tool.setuptools.package-dir]`). `make` installs forq editable in
setuptools' strict mode: build/__editable__.forq-*/ holds the installed layout as links
to the repository's files, which mypy, pyright and IDEs follow (the default mode's
import hook is invisible to them). Those links are made at install time, so a file
added or removed since needs a relink; `stale()` says which, `make venv` relinks.

    python -m tests.layout       # exit 1 with one line if the links are out of date
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
RELINK = "make venv"  # the command that relinks (Makefile)


def _setuptools() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def package_dirs() -> dict[str, Path]:
    """Every installed package (``forq.supervisor.loop``) → the folder it comes from."""
    table = _setuptools()
    roots = table["package-dir"]
    dirs = {}
    for package in table["packages"]:
        root = max((r for r in roots if package == r or package.startswith(r + ".")), key=len)
        rest = package[len(root):].lstrip(".").replace(".", "/")
        dirs[package] = REPO / roots[root] / rest if rest else REPO / roots[root]
    return dirs


def folders() -> dict[str, str]:
    """The top-level folders as installed paths: ``{"forq": "jobs", "forq/lua": "lua", …}``."""
    return {package.replace(".", "/"): folder
            for package, folder in _setuptools()["package-dir"].items()}


def installed_files() -> dict[str, Path]:
    """What an install lays out (``forq/supervisor/cli/jobs.py``) → the repository's file:
    each package's modules and its package data."""
    data = _setuptools().get("package-data", {})
    files = {}
    for package, folder in package_dirs().items():
        for pattern in ["*.py", *data.get(package, [])]:
            for path in folder.glob(pattern):
                if path.is_file():
                    inside = path.relative_to(folder).as_posix()
                    files[f"{package.replace('.', '/')}/{inside}"] = path
    return files


def link_tree() -> Path | None:
    """The directory holding the strict editable install's `forq/`, or None when forq is
    installed otherwise (a wheel, or the default editable mode's import hook)."""
    spec = importlib.util.find_spec("forq")
    if spec is None or spec.origin is None:
        return None
    init = Path(spec.origin)
    if not init.is_symlink():
        return None
    return init.parent.parent


def stale(tree: Path | None = None) -> list[str]:
    """What the link tree (this venv's unless given) lacks or holds too many of:
    ``+ jobs/x.py`` for a file not linked yet, ``- forq/old.py (links to …)`` for a link
    to a file gone or no longer installed; empty when it matches, or when forq is not
    installed in strict mode."""
    tree = tree or link_tree()
    if tree is None:
        return []
    wanted = installed_files()
    linked = {p.relative_to(tree).as_posix(): p for p in (tree / "forq").rglob("*")
              if p.is_symlink()}
    missing = [f"+ {wanted[k].relative_to(REPO)}" for k in sorted(wanted.keys() - linked.keys())]
    gone = [f"- {k} (links to {linked[k].readlink()})" for k in sorted(linked)
            if k not in wanted or not linked[k].exists()]
    return missing + gone


def stale_message() -> str:
    """One line saying the links are out of date and how to relink ("" if they are not)."""
    changes = stale()
    if not changes:
        return ""
    shown = ", ".join(changes[:5]) + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")
    return (f"forq's editable install ({link_tree()}) does not match the repository "
            f"({shown}): run `{RELINK}` to relink")


if __name__ == "__main__":
    message = stale_message()
    if message:
        print(message, file=sys.stderr)
    sys.exit(1 if message else 0)
