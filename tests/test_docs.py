"""Every code sample of the README and of docs/ runs here, so the documentation cannot
drift from what forq does (how samples are read and marked: tests/docs_samples.py).

A page's samples run in page order, against a private redis-server of this module's own:
* python: executed in one namespace per page, like a session at a prompt, with the
  samples' URL (redis://127.0.0.1:6379/0) replaced by the private server's; top-level
  `await` is allowed (asyncio samples). A sample that is a file of the application
  (its first line `# myapp/tasks.py`) is written into the page's project folder instead;
  the page's supervisor imports those that register tasks, and `test_*.py` files are
  run by pytest there, as a user would run them.
* toml: loaded by the supervisor's own loader (a fragment without a `[[queue]]` gets one).
* sh: run by bash (`set -euo pipefail`) in the repository, with this venv's `forq` and
  FORQ_REDIS_URL at the private server.
A page marked `<!-- test: supervisor for Q… -->` runs with a real `forq run` serving
those queues (tests/docs_app: stand-in handlers for tasks a page enqueues without showing
them, and the sample application's modules, `myapp.payments` & co.).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from forq.supervisor.config.load import load_config
from forq.testing.redis import RedisServer
from forq.testing.supervisor import SupervisorProcess, write_config
from tests.docs_samples import REPO, RUN, SHOWN, Page, Sample, pages

SAMPLE_URL = "redis://127.0.0.1:6379/0"
DOCS_APP = REPO / "tests" / "docs_app"
BIN = Path(sys.executable).parent
PAGES = pages()


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as redis_server:
        yield redis_server


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _write_files(page: Page, project: Path) -> list[Sample]:
    files = [s for s in page.samples() if s.file and s.not_run is None]
    for sample in files:
        assert sample.file is not None
        dest = project / sample.file
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(sample.code)
    return files


def _run_python(sample: Sample, namespace: dict[str, object], url: str) -> None:
    source = sample.code.replace(SAMPLE_URL, url)
    code = compile(source, sample.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))
    else:
        exec(code, namespace)


def _run_toml(sample: Sample, tmp_path: Path) -> None:
    text = sample.code
    if not re.search(r"^\[\[queue\]\]", text, flags=re.M):
        text += '\n[[queue]]\nname = "docs"\nconcurrency = 1\n'
    path = tmp_path / f"sample-{sample.line}.toml"
    path.write_text(text)
    load_config(path, env={})


def _env(url: str, *extra: Path) -> dict[str, str]:
    env = dict(os.environ, FORQ_REDIS_URL=url, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (*extra, DOCS_APP, REPO))
    return env


def _run(sample: Sample, argv: list[str], cwd: Path, env: dict[str, str],
         timeout: float = 90) -> None:
    """Run a sample's process in a session of its own, killed whole if it overstays (a
    session of the CLI guide runs 16 commands, ~1 s each here, ~5 s on a loaded host)."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{sample.where}: still running after {timeout}s\n{out}") from None
    assert proc.returncode == 0, f"{sample.where}: exit {proc.returncode}\n{out}"


def _run_sh(sample: Sample, url: str) -> None:
    _run(sample, ["bash", "-c", "set -euo pipefail\n" + sample.code], REPO, _env(url))


def _run_pytest(sample: Sample, project: Path, url: str) -> None:
    _run(sample, [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                  sample.file or ""], project, _env(url, project), timeout=90)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_sample_on_the_page_runs(page: Page, server: RedisServer, tmp_path: Path):
    admin = redis.Redis.from_url(server.url)
    admin.flushall()
    project = tmp_path / "project"
    project.mkdir()
    files = _write_files(page, project)
    supervisor = None
    queues = page.supervised_queues()
    if queues:
        imports = ["stand_ins"] + [_module(s.file) for s in files
                                   if s.file and "@task(" in s.code]
        config = write_config(tmp_path / "forq.toml", server.url, dict.fromkeys(queues, 2),
                              imports=imports, drain_timeout="1s")
        supervisor = SupervisorProcess(config, env={"PYTHONPATH": _env(server.url, project)[
            "PYTHONPATH"]}, cwd=str(project)).start()
    namespace: dict[str, object] = {"__name__": "__docs__"}
    sys.path[:0] = [str(project), str(DOCS_APP)]
    try:
        for sample in page.samples():
            if sample.not_run is not None or sample.lang not in RUN:
                continue
            if sample.lang == "python" and sample.file:
                if Path(sample.file).name.startswith("test_"):
                    _run_pytest(sample, project, server.url)
            elif sample.lang == "python":
                _run_python(sample, namespace, server.url)
            elif sample.lang == "toml":
                _run_toml(sample, tmp_path)
            else:
                _run_sh(sample, server.url)
    finally:
        del sys.path[:2]
        for name in [m for m in sys.modules if m == "myapp" or m.startswith("myapp.")]:
            del sys.modules[name]
        if supervisor is not None:
            supervisor.stop()
            log = supervisor.log()
            supervisor.close_log()
            assert "Traceback" not in log, log
        admin.close()


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_sample_is_run_or_says_why_not(page: Page):
    for sample in page.samples():
        assert sample.lang in RUN + SHOWN + ("redis",), (
            f"{sample.where}: a ```{sample.lang} block: tests/test_docs.py runs python, toml "
            f"and sh, and shows text; say which this is")
        if sample.not_run is not None:
            assert sample.not_run, f"{sample.where}: 'not run' needs a reason"
        elif sample.mark:
            assert sample.mark.startswith("supervisor for "), (
                f"{sample.where}: unknown mark {sample.mark!r}")


def test_the_readme_stays_a_tour():
    readme = (REPO / "README.md").read_text().splitlines()
    assert len(readme) <= 350, f"README.md has {len(readme)} lines: move the rest to docs/"
    # its first block is still the two commands a newcomer needs
    first = readme.index("```sh")
    assert first < 5 and readme[first + 1].startswith("make demo "), readme[:6]
    assert readme[first + 2].startswith("make test ") and readme[first + 3] == "```", readme[:6]


def test_every_page_is_in_the_site_nav():
    nav = (REPO / "mkdocs.yml").read_text()
    for path in sorted((REPO / "docs").rglob("*.md")):
        assert str(path.relative_to(REPO / "docs")) in nav, f"{path} is not in mkdocs.yml's nav"


ARCHITECTURE = REPO / "docs" / "architecture.md"
_PATH = re.compile(r"`((?:jobs|lua|supervisor|testing|web|systemd|etc|chaos|tests|bench|docs)"
                   r"/[A-Za-z0-9_.@*/-]*)`")


def test_every_path_the_architecture_page_names_exists():
    text = ARCHITECTURE.read_text()
    named = set(_PATH.findall(text))
    assert len(named) > 40, "the architecture page should name the files of every part"
    missing = sorted(p for p in named if not list(REPO.glob(p.rstrip("/"))))
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_box_of_the_architecture_diagram_has_its_file():
    text = ARCHITECTURE.read_text()
    diagram = text[text.index("```text"):text.index("```", text.index("```text") + 3)]
    boxes = set(re.findall(r"[├└]─ ([A-Z][A-Za-z]+)", diagram))
    boxes |= set(re.findall(r"\+ ([A-Z][A-Za-z]+)", diagram))
    for names in re.findall(r"\[([A-Z][A-Za-z]+(?:, [A-Z][A-Za-z]+)*)\]", diagram):
        boxes |= set(names.split(", "))
    table = text[text.index("| box |"):]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| ")]
    assert len(boxes) > 15, boxes
    missing = sorted(b for b in boxes if not any(re.search(rf"\b{b}\b", row) for row in rows))
    assert not missing, f"boxes of the diagram with no row (and file) in the table: {missing}"


def test_the_configuration_page_shows_every_line_of_the_example():
    page = (REPO / "docs" / "configuration.md").read_text()
    blocks = "\n".join(re.findall(r"```toml\n(.*?)```", page, flags=re.S))
    for line in (REPO / "etc" / "forq.toml").read_text().splitlines():
        assert line in blocks.splitlines() or not line.strip(), f"lost from the page: {line!r}"


_MODULE = re.compile(r"\b(forq(?:\.[a-z_]+)+)")
_RUN_MODULE = re.compile(r"python -m ([a-z_][a-z_.]*[a-z_])")
_NOT_MODULES = {"forq.env", "forq.service", "forq.toml", "forq.json", "forq.handler",
                "forq.job"}  # files and span names that look like module paths


def test_every_module_the_docs_name_exists():
    """`forq.x.y` (a module, or a name in one) and `python -m m` in the README and docs/:
    a module that moves must take its mentions along."""
    import importlib
    import importlib.util

    text = "\n".join(page.text for page in PAGES)
    for name in sorted(set(_MODULE.findall(text)) - _NOT_MODULES):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module(".".join(parts[:cut]))
                break
            except ImportError:
                continue
        for attr in parts[cut:]:
            assert hasattr(found, attr), f"the docs name {name}, which does not exist"
            found = getattr(found, attr)
    for name in sorted(set(_RUN_MODULE.findall(text))):
        assert importlib.util.find_spec(name) is not None, f"the docs run python -m {name}"
