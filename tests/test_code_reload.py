"""Code reload that interrupts nothing: SIGHUP starts a new fork server that imports the
handler modules afresh; jobs claimed after it run the new code, running jobs finish in
the old fork server, which stops with its last child. Each job record names the code
it ran, `forq supervisors` the code each supervisor serves; new code that does not
import leaves the old code serving and says so.

The handler package is written to a temporary directory on the supervisor's PYTHONPATH
and rewritten between jobs, as a deploy would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from forq import Queue
from forq.fleet import live_supervisors
from forq.supervisor.cli.main import main as forq_main
from forq.supervisor.fork.fingerprint import LENGTH, is_fingerprint
from tests.helpers import gone, wait_for, wait_job
from tests.supervisors import (
    TEST_IMPORTS,
    SupervisorProcess,
    fork_servers_of,
    wait_children,
    write_config,
)

APP = "reloadapp"
IMPORTS = (*TEST_IMPORTS, f"{APP}.tasks")
TASKS = '''
import os
import time

from forq import task

VERSION = {version!r}
{extra}


@task("reloadapp.version")
def version(until: str = "", timeout: float = 30.0):
    """The code version it ran, once the file `until` exists (a job that runs as long
    as the test wants)."""
    deadline = time.monotonic() + timeout
    while until and not os.path.exists(until):
        if time.monotonic() > deadline:
            raise TimeoutError(until)
        time.sleep(0.02)
    return {{"version": VERSION, "pid": os.getpid(), "ppid": os.getppid()}}
'''


def write_app(root: Path, version: str, extra: str = "") -> None:
    """The handler package as a deploy leaves it. Each version has its own length: a
    .pyc is reused when its source's mtime (in seconds) and size match."""
    package = root / APP
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(TASKS.format(version=version, extra=extra))


def start(tmp_path: Path, redis_url: str, queue: Queue, concurrency: int = 2,
          **options: Any) -> SupervisorProcess:
    options.setdefault("drain_timeout", "2s")
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: concurrency},
                          imports=IMPORTS, **options)
    return SupervisorProcess(config, env={"PYTHONPATH": str(tmp_path / "app")}).start()


def record_of(queue: Queue, sup: SupervisorProcess) -> dict[str, Any]:
    """This supervisor's heartbeat record, as `forq supervisors --json` prints it."""
    return next(r for r in live_supervisors(queue.redis) if r.get("pid") == sup.pid)


def supervisors_text(redis_url: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert forq_main(["--redis", redis_url, "supervisors"]) == 0
    return capsys.readouterr().out


def claimed_codes(job: Any) -> list[str]:
    return [e.get("code", "") for e in job.history if e["event"] == "claimed"]


def errors_in(log: str) -> list[str]:
    return [line for line in log.splitlines()
            if " ERROR " in line or "WARNING" in line or "Traceback" in line]


@pytest.mark.timeout(90)
def test_a_reload_runs_new_code_for_new_jobs_and_lets_the_running_one_finish_in_the_old(
        tmp_path, redis_url, queue, capsys):
    write_app(tmp_path / "app", "one")
    release = tmp_path / "release"
    sup = start(tmp_path, redis_url, queue)
    try:
        (old,) = wait_for(lambda: fork_servers_of(sup.pid), timeout=10, message="fork server")
        long = queue.enqueue("reloadapp.version", str(release)).id
        wait_children(sup.pid, 1)
        wait_for(lambda: queue.get(long).state == "active", timeout=10, message="running")
        old_code = queue.get(long).fields["code"]
        assert is_fingerprint(old_code), old_code  # no [supervisor].version: the fingerprint
        assert record_of(queue, sup)["code"] == old_code

        write_app(tmp_path / "app", "second")  # the deploy: new files on disk
        sup.signal(signal.SIGHUP)
        wait_for(lambda: "reloaded" in sup.log(), timeout=30, message="the reload")
        (new,) = [p for p in fork_servers_of(sup.pid) if p != old]
        fresh = queue.enqueue("reloadapp.version")
        done = fresh.wait(timeout=10)
        assert done["version"] == "second" and done["ppid"] == new, (done, old, new)
        new_code = queue.get(fresh.id).fields["code"]
        assert is_fingerprint(new_code) and new_code != old_code
        assert claimed_codes(queue.get(fresh.id)) == [new_code]

        # the supervisor serves the new code, and says an old fork server finishes one job
        record = record_of(queue, sup)
        assert record["code"] == new_code
        assert record["code_retiring"] == [{"code": old_code, "pid": old, "jobs": 1}], record
        text = supervisors_text(redis_url, capsys)
        assert f"{new_code} (+1 on old)" in text, text
        assert f"old fork server {old} finishing 1 job(s) in code {old_code}" in text, text
        assert old in fork_servers_of(sup.pid)

        # the running job finishes in the old code, in its old fork server, run once
        release.touch()
        job = wait_job(queue, long, ("succeeded",), context=sup.log)
        assert job.result["version"] == "one" and job.result["ppid"] == old, job.result
        assert [e["event"] for e in job.history] == ["enqueued", "claimed", "succeeded"]
        assert job.fields["code"] == old_code and claimed_codes(job) == [old_code]
        # and the old fork server goes with its last child
        wait_for(lambda: gone(old), timeout=10, message="the old fork server to stop")
        wait_for(lambda: record_of(queue, sup)["code_retiring"] == [], timeout=10,
                 message="no old fork server in the heartbeat")
        assert fork_servers_of(sup.pid) == [new]
    finally:
        sup.stop()
    log = sup.log()
    assert not errors_in(log), log[-4000:]
    assert f"old fork server {old} stopped" in log
    assert f"code {new_code}" in log  # the reload's log line names what it serves now


@pytest.mark.timeout(90)
def test_new_code_that_does_not_import_leaves_the_old_code_serving_and_says_so(
        tmp_path, redis_url, queue, capsys):
    write_app(tmp_path / "app", "one")
    sup = start(tmp_path, redis_url, queue, supervisor_extra='version = "v1"')
    try:
        (old,) = wait_for(lambda: fork_servers_of(sup.pid), timeout=10, message="fork server")
        first = queue.enqueue("reloadapp.version")
        assert first.wait(timeout=10)["version"] == "one"
        code = queue.get(first.id).fields["code"]
        assert code.startswith("v1+") and is_fingerprint(code[3:]), code

        write_app(tmp_path / "app", "broken", extra='raise RuntimeError("half deployed")')
        sup.signal(signal.SIGHUP)
        wait_for(lambda: "reload refused" in sup.log(), timeout=30, message="the refusal")
        lines = [line for line in sup.log().splitlines() if "reload refused" in line]
        assert len(lines) == 1, lines  # one line, naming the module, the error, the code kept
        assert f"{APP}.tasks" in lines[0] and "RuntimeError: half deployed" in lines[0], lines
        assert code in lines[0], lines
        assert fork_servers_of(sup.pid) == [old]  # the old one goes on serving
        again = queue.enqueue("reloadapp.version")
        done = again.wait(timeout=10)
        assert done["version"] == "one" and done["ppid"] == old, done
        assert queue.get(again.id).fields["code"] == code

        refused = record_of(queue, sup)["reload_error"]
        assert refused["module"] == f"{APP}.tasks" and "half deployed" in refused["error"]
        text = supervisors_text(redis_url, capsys)
        assert f"{code} (reload refused)" in text, text
        assert "reload refused at" in text and "RuntimeError: half deployed" in text, text

        # the deploy finished: the next reload applies, and the refusal is forgotten
        write_app(tmp_path / "app", "three")
        sup.signal(signal.SIGHUP)
        wait_for(lambda: "reloaded" in sup.log(), timeout=30, message="the reload")
        assert queue.enqueue("reloadapp.version").wait(timeout=10)["version"] == "three"
        record = record_of(queue, sup)
        assert "reload_error" not in record and record["code"] != code, record
        wait_for(lambda: gone(old), timeout=10, message="the old fork server (idle) stopped")
    finally:
        sup.stop()
    assert "Traceback" not in sup.log()


@pytest.mark.timeout(90)
def test_jobs_go_on_in_the_old_code_while_the_new_code_imports(tmp_path, redis_url, queue):
    """The new fork server imports without holding the supervisor up: jobs claimed
    meanwhile run in the old one. A second SIGHUP while it imports supersedes it."""
    gate = tmp_path / "gate"
    write_app(tmp_path / "app", "one")
    sup = start(tmp_path, redis_url, queue)
    try:
        (old,) = wait_for(lambda: fork_servers_of(sup.pid), timeout=10, message="fork server")
        # the new code imports only once the test opens the gate (a slow import)
        slow = f"""
import os as _os, time as _time
_deadline = _time.monotonic() + 30
while not _os.path.exists({str(gate)!r}) and _time.monotonic() < _deadline:
    _time.sleep(0.02)
"""
        write_app(tmp_path / "app", "second", extra=slow)
        sup.signal(signal.SIGHUP)
        (first,) = wait_for(lambda: [p for p in fork_servers_of(sup.pid) if p != old],
                            timeout=10, message="the new fork server importing")
        meanwhile = queue.enqueue("reloadapp.version")
        done = meanwhile.wait(timeout=10)
        assert done["version"] == "one" and done["ppid"] == old, done
        assert record_of(queue, sup)["code"] == queue.get(meanwhile.id).fields["code"]
        write_app(tmp_path / "app", "third!", extra=slow)
        sup.signal(signal.SIGHUP)  # supersedes the one importing
        wait_for(lambda: gone(first), timeout=10, message="the superseded fork server gone")
        (second,) = wait_for(lambda: [p for p in fork_servers_of(sup.pid) if p not in (old, first)],
                             timeout=10, message="the newest fork server importing")
        assert "reloaded" not in sup.log()
        gate.touch()
        wait_for(lambda: "reloaded" in sup.log(), timeout=30, message="the reload")
        done = queue.enqueue("reloadapp.version").wait(timeout=10)
        assert done["version"] == "third!" and done["ppid"] == second, done
        assert sup.log().count("reloaded") == 1
    finally:
        sup.stop()
    assert not errors_in(sup.log()), sup.log()[-4000:]


@pytest.mark.timeout(90)
def test_a_job_held_ahead_of_a_slot_is_given_back_on_a_code_change_and_runs_the_new_code(
        tmp_path, redis_url, queue):
    """Its record named the code at its claim: it is released (nothing counted) and
    claimed again, so the record names the code it runs."""
    write_app(tmp_path / "app", "one")
    release = tmp_path / "release"
    sup = start(tmp_path, redis_url, queue, concurrency=1, queue_extra="prefetch = 1\n")
    try:
        running = queue.enqueue("reloadapp.version", str(release)).id
        wait_for(lambda: queue.get(running).state == "active", timeout=10, message="running")
        held = queue.enqueue("reloadapp.version").id
        wait_for(lambda: queue.get(held).state == "active", timeout=10, message="held")
        old_code = queue.get(held).fields["code"]

        write_app(tmp_path / "app", "second")
        sup.signal(signal.SIGHUP)
        wait_for(lambda: "reloaded" in sup.log(), timeout=30, message="the reload")
        wait_for(lambda: len(claimed_codes(queue.get(held))) == 2, timeout=10,
                 message="the held job claimed again")
        release.touch()
        job = wait_job(queue, held, ("succeeded",), context=sup.log)
        assert job.result["version"] == "second", job.result
        events = [e["event"] for e in job.history]
        assert events == ["enqueued", "claimed", "released", "claimed", "succeeded"], job.history
        assert job.attempts == 1 and job.crashes == 0
        first, second = claimed_codes(job)
        assert first == old_code and second == job.fields["code"] != old_code
        assert wait_job(queue, running, ("succeeded",)).result["version"] == "one"
    finally:
        sup.stop()
    assert "Traceback" not in sup.log()


@pytest.mark.timeout(60)
def test_a_fork_server_that_lies_about_its_code_is_not_used(tmp_path, redis_url, queue):
    """The fingerprint comes from a process that ran handler code: a malformed one is
    refused like a malformed task table (each child is then started alone)."""
    write_app(tmp_path / "app", "one", extra=textwrap.dedent("""
        from forq.supervisor.fork import fingerprint
        fingerprint.fingerprint = lambda imports: "\\x1b[2J" + "x" * 100_000
    """))
    sup = start(tmp_path, redis_url, queue)
    try:
        job = queue.enqueue("reloadapp.version")
        done = job.wait(timeout=20)
        assert done["version"] == "one" and done["ppid"] == sup.pid, done
        assert queue.get(job.id).fields["code"] == ""  # not known: said so, not guessed
        assert not fork_servers_of(sup.pid)
    finally:
        sup.stop()
    assert "bad code fingerprint" in sup.log(), sup.log()[-3000:]


# -- the fingerprint -------------------------------------------------------------------


def fingerprint_in(app: Path, imports: tuple[str, ...] = (f"{APP}.tasks",)) -> str:
    """The fingerprint a fork server would compute with `app` on its path (a fresh
    interpreter: only what the imports load is loaded)."""
    code = ("import importlib, sys\n"
            f"for name in {list(imports)!r}: importlib.import_module(name)\n"
            "from forq.supervisor.fork.fingerprint import fingerprint\n"
            f"print(fingerprint({list(imports)!r}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=app, capture_output=True,
                         text=True, timeout=30, check=True,
                         env=dict(os.environ, PYTHONPATH=str(app), PYTHONDONTWRITEBYTECODE="1"))
    return out.stdout.strip()


@pytest.mark.timeout(60)
def test_the_fingerprint_follows_the_application_files_wherever_they_live(tmp_path):
    here, there = tmp_path / "here", tmp_path / "there"
    for root in (here, there):
        write_app(root, "one")
        (root / APP / "lazy.py").write_text("WHAT = 1\n")  # imported by a handler, at job time
        (root / "helpers.py").write_text("X = 1\n")  # another top-level module of the app
    base = fingerprint_in(here)
    assert len(base) == LENGTH and is_fingerprint(base)
    assert fingerprint_in(there) == base  # the same files elsewhere: the same code
    (there / APP / "lazy.py").write_text("WHAT = 2\n")
    lazy = fingerprint_in(there)
    assert lazy != base  # a module of the handler package, imported or not
    (there / "helpers.py").write_text("X = 2\n")  # not imported by the handlers: not theirs
    assert fingerprint_in(there) == lazy
    write_app(there, "one", extra="import helpers")
    imported = fingerprint_in(there)
    (there / "helpers.py").write_text("X = 3\n")  # imported now: it counts
    assert fingerprint_in(there) not in (imported, lazy, base)


@pytest.mark.timeout(60)
def test_forq_and_the_installed_libraries_are_not_the_application(tmp_path):
    """Only the application's own files count: the standard library, site-packages and
    forq's own modules the handlers import do not (the listed modules always do)."""
    write_app(tmp_path, "one", extra="import json, email.mime.text, redis, forq.examples")
    out = subprocess.run(
        [sys.executable, "-m", "forq.supervisor.fork.fingerprint", f"{APP}.tasks"],
        cwd=tmp_path, capture_output=True, text=True, timeout=30, check=True,
        env=dict(os.environ, PYTHONPATH=str(tmp_path), PYTHONDONTWRITEBYTECODE="1")).stdout
    first, *files = out.splitlines()
    assert is_fingerprint(first) and first == fingerprint_in(tmp_path), out
    assert [line.split()[0] for line in files] == [APP, f"{APP}.tasks"], out
    assert files[1].split()[1] == str(tmp_path / APP / "tasks.py"), out


@pytest.mark.timeout(60)
def test_a_fifo_in_the_handler_package_does_not_hang_the_fingerprint(tmp_path):
    """What a handler package holds is the handler's: a FIFO named like a module would
    block a plain open() for ever, and the fork server's start with it."""
    write_app(tmp_path, "one")
    base = fingerprint_in(tmp_path)
    os.mkfifo(tmp_path / APP / "trap.py")
    trapped = fingerprint_in(tmp_path)  # within fingerprint_in's timeout
    assert is_fingerprint(trapped) and trapped != base
