"""The code a fork server runs: a fingerprint of the handler modules' files.

After a reload, jobs run in a new fork server that imported the handler modules afresh,
and the jobs still running finish in the old one: each job record names the code it
ran, and `forq supervisors` the code each supervisor serves. The fork server computes
this once, after importing `[supervisor].imports` and before it forks anything, and
reports it with its task table (`protocol`): it costs nothing per job.

What it covers (the README, "Rolling out new handler code", says the same):

* every module loaded once the handler modules are imported — what they import,
  transitively — whose file lies in the application's own directories: a `sys.path`
  entry outside the Python installation (the standard library, site-packages, the
  venv), such as the working directory or `PYTHONPATH`;
* the listed modules themselves, wherever they are installed (a handler package
  installed with pip into the venv counts);
* every `.py` file of a listed module's top-level package when that package is the
  application's (in its own directories), imported or not, so a module a handler
  imports lazily at job time counts too (at most `MAX_WALKED` files).

forq's own modules are left out unless listed (`forq.examples`): forq is the framework,
its version is reported beside the code (`forq supervisors`' forq column). Libraries
in site-packages are left out too: a deploy that upgrades one says so with
`[supervisor].version`.

Each file counts by its module name and a SHA-256 of its content, never its path or
mtime: the same code checked out in two places on two machines has the same
fingerprint. A file that cannot be read counts as unreadable, never as an error: the
fingerprint is a label, and a fork server must start.
"""

from __future__ import annotations

import hashlib
import os
import site
import stat
import sys
import sysconfig
from collections.abc import Iterable, Sequence

LENGTH = 12  # hex digits: 48 bits, to tell deploys apart, not a security hash
MAX_WALKED = 2000  # .py files read from one listed package's directory
MAX_SCANNED = 50_000  # names (files and directories) looked at in that directory
MAX_FILE = 32 << 20  # bytes of one file hashed (a larger one counts by its size too)
FRAMEWORK = "forq"


def fingerprint(imports: Sequence[str]) -> str:
    """The fingerprint of the code loaded now, `imports` being the listed handler
    modules (already imported): LENGTH hex digits."""
    files = covered(imports)
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode(errors="replace") + b"\0" + _file_digest(files[name]) + b"\n")
    return digest.hexdigest()[:LENGTH]


def covered(imports: Sequence[str]) -> dict[str, str]:
    """The files the fingerprint covers: module name -> path (the module docstring
    says which)."""
    installed = _installation_dirs()
    roots = [r for r in _path_dirs() if not _under(r, installed)]

    def ours(path: str) -> bool:
        return _under(path, roots) and not _under(path, installed)

    listed = set(imports)
    files: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path:
            continue
        if name in listed or (name.partition(".")[0] != FRAMEWORK and ours(path)):
            files[name] = path
    for top in sorted({name.partition(".")[0] for name in imports} - {FRAMEWORK}):
        package = sys.modules.get(top)
        for directory in getattr(package, "__path__", None) or []:
            if isinstance(directory, str) and ours(directory):
                for name, path in _walk(top, directory):
                    files.setdefault(name, path)
    return files


def is_fingerprint(value: object) -> bool:
    """Whether `value` is what `fingerprint` returns (the supervisor checks what its
    fork server reports: handler code ran there)."""
    return (isinstance(value, str) and len(value) == LENGTH
            and all(c in "0123456789abcdef" for c in value))


def code_name(version: str, fingerprint_: str) -> str:
    """What a job record and `forq supervisors` show: `[supervisor].version` and the
    fingerprint, "VERSION+FINGERPRINT" (either alone when the other is unknown: no
    version set, or no fork server to say what it imported; "" when neither)."""
    return "+".join(part for part in (version, fingerprint_) if part)


def _walk(top: str, directory: str) -> Iterable[tuple[str, str]]:
    """(module name, path) of the .py files under a package directory, in a fixed
    order, at most MAX_WALKED of them among at most MAX_SCANNED names (a package that
    holds a data tree must not hold the start up); hidden directories and __pycache__
    skipped, symbolic links to directories not followed."""
    found = scanned = 0
    for base, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        scanned += len(dirs) + len(names)
        if scanned > MAX_SCANNED:
            return
        relative = os.path.relpath(base, directory)
        prefix = top if relative == "." else ".".join([top, *relative.split(os.sep)])
        for file in sorted(names):
            if not file.endswith(".py"):
                continue
            if found >= MAX_WALKED:
                return
            found += 1
            stem = file[:-3]
            yield (prefix if stem == "__init__" else f"{prefix}.{stem}"), os.path.join(base, file)


def _file_digest(path: str) -> bytes:
    """A file's SHA-256 (hex): its first MAX_FILE bytes, and its size if larger. Opened
    without blocking and read only if it is a regular file (a FIFO named x.py must not
    hang the fork server's start)."""
    digest = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b"unreadable"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return b"not a file"
        with os.fdopen(fd, "rb", closefd=False) as f:
            digest.update(f.read(MAX_FILE))
        if info.st_size > MAX_FILE:
            digest.update(b"size:%d" % info.st_size)
    except OSError:
        return b"unreadable"
    finally:
        os.close(fd)
    return digest.hexdigest().encode()


def _path_dirs() -> list[str]:
    dirs = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if os.path.isdir(path):
            dirs.append(path)
    return dirs


def _installation_dirs() -> list[str]:
    """Where the Python installation keeps code: the standard library, site-packages
    (the venv's, the system's, the user's). Not its prefixes: /usr is one."""
    dirs: set[str] = set()
    paths = sysconfig.get_paths()
    dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths)
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # an old virtualenv's site module
        pass
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if isinstance(user, str):
        dirs.add(user)
    return [os.path.realpath(d) for d in dirs if d]


def _under(path: str, dirs: Iterable[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == d or real.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)


def main(argv: Sequence[str]) -> int:
    """`python -m forq.supervisor.fork.fingerprint MODULE...`: import the handler
    modules as a fork server would (run it where the supervisor runs, with its
    PYTHONPATH), print the fingerprint and the files it covers."""
    import importlib

    if not argv:
        print("usage: python -m forq.supervisor.fork.fingerprint MODULE...", file=sys.stderr)
        return 2
    for name in argv:
        importlib.import_module(name)
    print(fingerprint(argv))
    for name, path in sorted(covered(argv).items()):
        print(f"  {name}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
