"""The example apps in examples/, end to end: a real web server (uvicorn, Django's own),
real HTTP, a real supervisor running the jobs, and the enqueue-after-commit promise:
a committed change gets its job, a rolled-back one none."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from forq import JobNotFound
from forq.testing.supervisor import SupervisorProcess
from tests.helpers import wait_for, wait_job
from tests.redis_server import free_port
from tests.supervisors import REPO, write_config

EXAMPLES = REPO / "examples"


def _env(app_dir: Path, **extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=f"{app_dir}{os.pathsep}{REPO}", **extra)


@contextmanager
def _server(argv: list[str], app_dir: Path, env: dict[str, str], port: int,
            log: Path) -> Iterator[str]:
    """A web server process, until it answers on `port`; stopped afterwards."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=app_dir, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, f"server exited:\n{log.read_text()}"
        try:
            urllib.request.urlopen(f"{base}/jobs/none", timeout=2)
        except urllib.error.HTTPError:
            return True  # it answered (404)
        except OSError:
            return False
        return True

    try:
        wait_for(up, timeout=30, message=f"{argv[0]} on port {port}")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _call(method: str, url: str, data: dict[str, str] | None = None) -> tuple[int, Any]:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _supervisor(tmp_path: Path, redis_url: str, queue_name: str, app_dir: Path,
                module: str) -> SupervisorProcess:
    config = write_config(tmp_path / "forq.toml", redis_url, {queue_name: 2},
                          imports=(module,), drain_timeout="1s")
    # the app's folder on the path, as `PYTHONPATH=. forq run` in it would have it
    return SupervisorProcess(config, env={"PYTHONPATH": f"{app_dir}{os.pathsep}{REPO}"},
                             cwd=str(app_dir))


def _done(base: str, job_id: str) -> Any:
    def check() -> Any:
        status, body = _call("GET", f"{base}/jobs/{job_id}")
        return body if status == 200 and body["state"] in ("succeeded", "dead") else None
    return wait_for(check, timeout=20, message=f"job {job_id} to finish")


@pytest.mark.timeout(120)
def test_fastapi_example_outbox(tmp_path, redis_url, queue):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    app_dir = EXAMPLES / "fastapi_app"
    db_path = tmp_path / "signup.sqlite3"
    env = _env(app_dir, FORQ_REDIS_URL=redis_url, SIGNUP_QUEUE=queue.name,
               SIGNUP_DB=str(db_path), SIGNUP_RELAY_EVERY="0.2")
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1",
            "--port", str(port)]
    with _supervisor(tmp_path, redis_url, queue.name, app_dir, "welcome") as sup, \
            _server(argv, app_dir, env, port, tmp_path / "uvicorn.log") as base:
        status, body = _call("POST", f"{base}/signup?email=ada@example.com")
        assert status == 200, body
        done = _done(base, body["job"])
        assert done == {"state": "succeeded",
                        "result": f"welcome mail to ada@example.com (job {body['job']})"}

        # a second signup rolls back: no user, no outbox row, no job
        status, again = _call("POST", f"{base}/signup?email=ada@example.com")
        assert status == 409 and "signed up already" in again["detail"]
        assert queue.stats()["pending"] + queue.stats()["active"] == 0

        # the app died between its commit and its enqueue: the row is still in the
        # outbox, and the relay enqueues it (once, under the row's id)
        db = sqlite3.connect(db_path, isolation_level=None)
        db.execute("INSERT INTO users VALUES ('bob@example.com')")
        db.execute("INSERT INTO outbox VALUES ('left-behind-1', 'welcome.send', "
                   "'[\"bob@example.com\"]', ?)", (time.time(),))
        job = wait_job(queue, "left-behind-1", ("succeeded", "dead"), context=sup.log)
        assert job.result == "welcome mail to bob@example.com (job left-behind-1)"
        wait_for(lambda: not db.execute("SELECT * FROM outbox").fetchall(),
                 message="the relay to empty the outbox")
        assert queue.stats()["succeeded"] == 2


@pytest.mark.timeout(120)
def test_django_example_enqueue_on_commit(tmp_path, redis_url, queue):
    pytest.importorskip("django")
    app_dir = EXAMPLES / "django_app"
    env = _env(app_dir, FORQ_REDIS_URL=redis_url, SHOP_QUEUE=queue.name,
               SHOP_DB=str(tmp_path / "shop.sqlite3"), DJANGO_SETTINGS_MODULE="shop.settings")
    migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"],
                             cwd=app_dir, env=env, capture_output=True, text=True, timeout=60)
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    port = free_port()
    argv = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"]
    with _supervisor(tmp_path, redis_url, queue.name, app_dir, "shop.tasks") as sup, \
            _server(argv, app_dir, env, port, tmp_path / "django.log") as base:
        status, body = _call("POST", f"{base}/orders", {"email": "ada@example.com"})
        assert status == 200, body
        done = _done(base, body["job"])
        assert done == {"state": "succeeded", "result":
                        f"receipt for order {body['order']} sent to ada@example.com "
                        f"(job {body['job']})"}

        # the view raises inside atomic(): the order rolls back, its job is never sent
        status, refused = _call("POST", f"{base}/orders", {"email": "eve@elsewhere.org"})
        assert status == 400 and refused["job"], refused
        with pytest.raises(JobNotFound):
            queue.get(refused["job"])
        assert _call("GET", f"{base}/jobs/{refused['job']}")[0] == 404
        stats = queue.stats()
        assert (stats["pending"], stats["active"], stats["succeeded"]) == (0, 0, 1), stats
    assert "Traceback" not in sup.log()
