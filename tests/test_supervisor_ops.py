"""A real supervisor seen the way an operator sees it: the metrics endpoint scraped over
HTTP after known work, promtool on the scrape, sd_notify messages on a real socket, and
JSON logs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from forq import Queue
from tests.helpers import wait_for
from tests.redis_server import free_port
from tests.supervisors import SupervisorProcess, write_config


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        return resp.read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample with exactly these labels (order-insensitive)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        match = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if found == labels:
            return float(match.group(3))
    return None


@pytest.mark.timeout(90)
def test_metrics_endpoint_counts_known_work(tmp_path, redis_url, queue: Queue):
    port = free_port()
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2},
                          extra=f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    # write_config put an empty [metrics] table first: keep only ours
    text = config.read_text().replace('[metrics]\nlisten = ""\n', "", 1)
    config.write_text(text)
    with SupervisorProcess(config) as sup:
        ok = [queue.enqueue("tests.echo", i) for i in range(3)]
        dead = queue.enqueue("tests.fail", max_attempts=1)
        crash = queue.enqueue("examples.exit", 3, max_crashes=1)
        for job in ok:
            assert job.wait(timeout=20) == {"args": [ok.index(job)], "kwargs": {}}
        for job in (dead, crash):
            wait_for(lambda j=job: queue.get(j.id).state == "dead", timeout=20,
                     message=f"job {job.id} dead")
        pending = queue.enqueue("tests.echo", delay="1h")

        def settled() -> str | None:
            body = scrape(port)
            done = sample(body, "forq_jobs_finished_total", queue=queue.name, task="examples.exit",
                          outcome="crashed")
            return body if done == 1 else None

        body = wait_for(settled, timeout=10, message="metrics to record the crash")
        q = queue.name
        assert sample(body, "forq_jobs_started_total", queue=q, task="tests.echo") == 3
        assert sample(body, "forq_jobs_finished_total", queue=q, task="tests.echo",
                      outcome="succeeded") == 3
        assert sample(body, "forq_jobs_finished_total", queue=q, task="tests.fail",
                      outcome="dead") == 1
        assert sample(body, "forq_slots", queue=q) == 2
        assert sample(body, "forq_children_running", queue=q) == 0
        assert sample(body, "forq_reclaimed_total", queue=q) == 1
        assert sample(body, "forq_job_duration_seconds_count", queue=q, task="tests.echo") == 3
        assert sample(body, "forq_job_wait_seconds_count", queue=q) == 5
        assert sample(body, "forq_queue_jobs", queue=q, state="scheduled") == 1
        assert sample(body, "forq_queue_jobs", queue=q, state="dead") == 2
        assert sample(body, "forq_queue_jobs", queue=q, state="pending") == 0
        assert pending.id
        promtool = shutil.which("promtool")
        if promtool is None:
            if os.environ.get("CI"):
                pytest.fail("promtool is missing in CI (Debian package prometheus)")
            pytest.skip("promtool not installed (apt-get install prometheus)")
        check = subprocess.run([promtool, "check", "metrics"], input=body, text=True,
                               capture_output=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
        assert sup.stop() == 0


@pytest.mark.timeout(60)
def test_sd_notify_ready_status_watchdog_stopping_in_order(tmp_path, redis_url, queue: Queue):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1})
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
    messages: list[str] = []

    def receive_until(prefix: str) -> None:
        while not any(m.startswith(prefix) for m in messages):
            messages.extend(sock.recv(4096).decode().splitlines())

    try:
        with SupervisorProcess(config, env=env) as sup:
            receive_until("READY=1")
            receive_until("WATCHDOG=1")
            sup.signal(signal.SIGTERM)
            receive_until("STOPPING=1")
            assert sup.wait(timeout=20) == 0
    finally:
        sock.close()
    kinds = [m.split("=", 1)[0] for m in messages]
    assert "STATUS" in kinds
    ready, watchdog, stopping = (kinds.index(k) for k in ("READY", "WATCHDOG", "STOPPING"))
    assert ready < watchdog < stopping, messages
    assert any(m.startswith("STATUS=running: 0/1 busy") for m in messages), messages


@pytest.mark.timeout(60)
def test_json_logs_one_line_per_transition(tmp_path, redis_url, queue: Queue):
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1})
    config.write_text(config.read_text().replace(
        'memory_sample_interval = "20ms"', 'memory_sample_interval = "20ms"\nlog_format = "json"'))
    with SupervisorProcess(config) as sup:
        job = queue.enqueue("tests.echo", 1)
        job.wait(timeout=20)
        wait_for(lambda: job.id in sup.log() and "succeeded" in sup.log(), timeout=10,
                 message="the job's log lines")
    lines = [json.loads(line) for line in sup.log().splitlines() if line.startswith("{")]
    mine = [entry for entry in lines if entry.get("job") == job.id]
    assert [entry["event"] for entry in mine] == ["started", "succeeded"], mine
    assert all(entry["level"] == "info" and entry["time"].endswith("Z") for entry in mine)


def test_a_metrics_address_in_use_is_one_line_and_exit_1(tmp_path, redis_url, queue: Queue):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "forq.toml"
        config.write_text(f'[redis]\nurl = "{redis_url}"\n[supervisor]\n'
                          f'imports = ["forq.examples"]\n[[queue]]\nname = "{queue.name}"\n'
                          f'concurrency = 1\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
        done = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "run", "--config",
                               str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and f"cannot serve metrics on 127.0.0.1:{port}" in errors[0]
    assert "[metrics].listen" in errors[0] and "Traceback" not in done.stderr
