"""Progress and durable steps (`current().progress`, `current().step`), through a real
supervisor: real children, a real SIGKILL, the Lua scripts on a real Redis."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from forq import Queue
from forq.channel import Channel, LeaseLost
from forq.supervisor.children.reader import MessageReader
from forq.supervisor.cli import render
from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for, wait_job
from tests.supervisors import REPO, TEST_IMPORTS, SupervisorProcess, write_config

pytestmark = pytest.mark.timeout(90)

IMPORTS = (*TEST_IMPORTS, "tests.steps_tasks")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(params=[True, False], ids=["fork_server", "oneshot"])
def sup(request, tmp_path, redis_url, queue):
    """A supervisor on `queue`, its children forked by the fork server or exec'd alone,
    its metrics on `sup.metrics_url`."""
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2}, imports=IMPORTS,
                          supervisor_extra=f"fork_server = {str(request.param).lower()}")
    port = free_port()
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    proc = SupervisorProcess(config).start()
    proc.metrics_url = f"http://127.0.0.1:{port}/metrics"
    yield proc
    proc.stop()


def metric(sup, name: str, **labels: str) -> float:
    """One sample of the supervisor's /metrics (0 when absent)."""
    with urllib.request.urlopen(sup.metrics_url, timeout=10) as response:
        text = response.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.startswith(name + "{") and ",".join(sorted(
                series[len(name) + 1:-1].split(","))) == want:
            return float(value)
    return 0.0


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


# -- durable steps -------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["steps.three", "steps.async_three"])
def test_a_job_killed_after_step_two_runs_only_step_three_again(sup, queue, tmp_path, task):
    runs, flag = tmp_path / "runs", tmp_path / "crashed"
    job = queue.enqueue(task, str(runs), str(flag), max_crashes=3)
    done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
    assert done.state == "succeeded", (done.history, sup.log()[-3000:])
    assert flag.exists() and done.crashes == 1, done.history  # it was killed once
    assert lines(runs) == ["one", "two", "three"]  # each step's function ran once
    assert done.result == ["one", {"charged": "two"} if task == "steps.three" else "two",
                           "three"]
    assert list(done.steps) == ["one", "two", "three"]
    assert done.steps["one"] == "one"
    shown = render.job(done)
    assert "steps" in shown and "three" in shown, shown
    assert metric(sup, "forq_steps_recorded_total", queue=queue.name, outcome="ok") == 3


def test_a_stale_token_cannot_record_a_step(queue):
    queue.enqueue("tests.echo", job_id="stale-step", keep_history=True)
    lease = leasing(queue).claim("me", 1, 60_000).leases[0]
    assert leasing(queue).record_step(lease.id, "not-the-token", "one", '"x"') == "lost"
    assert leasing(queue).record_step(lease.id, lease.token, "one", '"first"') == "ok"
    assert leasing(queue).record_step(lease.id, lease.token, "one", '"second"') == "ok"  # first kept
    assert leasing(queue).record_progress([(lease.id, "not-the-token", 0.5, "")]) == ["lost"]
    job = queue.get(lease.id)
    assert job.steps == {"one": "first"} and job.progress is None
    assert leasing(queue).ack(lease.id, lease.token, "null") == "ok"
    assert leasing(queue).record_step(lease.id, lease.token, "two", "2") == "lost"  # not active
    assert queue.get(lease.id).steps == {"one": "first"}


def test_a_supervisor_whose_lease_was_taken_cannot_record_a_step(sup, queue, tmp_path):
    runs, go = tmp_path / "runs", tmp_path / "go"
    job = queue.enqueue("steps.held_up", str(runs), str(go), max_crashes=1, max_attempts=1)
    wait_for(lambda: list(queue.get(job.id).steps) == ["one"], timeout=20,
             message="step one recorded")
    # another supervisor's claim, as a reclaim would make it: a new token on the job, and
    # a lease that this test holds (so no reaper runs the job again meanwhile)
    queue.redis.hset(queue.keys.job(job.id), "token", "someone-else")
    queue.redis.zadd(queue.keys.active, {job.id: 1 << 50})
    go.touch()  # step two's function returns now; its record must be refused
    wait_for(lambda: "lease lost" in sup.log() or "answered lost" in sup.log(), timeout=20,
             message="the supervisor to see its lease lost")
    wait_for(lambda: f"job {job.id}" in sup.log() and "dropped" in sup.log(), timeout=20,
             message="the child's end dropped")
    assert lines(runs) in (["one"], ["one", "two"])  # the function may have run...
    assert list(queue.get(job.id).steps) == ["one"]  # ...its result was never recorded
    assert "after" not in lines(runs)  # and the handler did not go on
    assert "Traceback" not in sup.log()


# -- progress --------------------------------------------------------------------------------


def test_progress_is_readable_while_the_job_runs_and_after(sup, queue, tmp_path, redis_url):
    go = tmp_path / "go"
    job = queue.enqueue("steps.progress", str(go))
    running = wait_for(lambda: (queue.get(job.id).progress or {}).get("value") == 0.5
                       and queue.get(job.id), timeout=20, message="progress 0.5 in Redis")
    assert running.state == "active"
    assert running.progress["message"] == "half way" and running.progress["at"] > 0
    assert "half way" in render.job(running)
    go.touch()
    assert job.wait(timeout=20) == "ok"
    done = queue.get(job.id)
    assert done.progress["value"] == 1.0 and done.progress["message"] == "done"
    shown = subprocess.run(
        [sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url, "job", job.id,
         "--json"], capture_output=True, text=True, timeout=30, cwd=str(REPO),
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["progress"]["message"] == "done"


class ScriptMonitor:
    """Counts the calls of one script Redis runs (MONITOR on a socket of its own)."""

    def __init__(self, url: str, sha: str) -> None:
        host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.sock.sendall(b"MONITOR\r\n")
        self.sha = sha.encode()
        self.calls = 0
        self.stopped = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        tail = b""
        self.sock.settimeout(0.2)
        while not self.stopped:
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            data = tail + data
            self.calls += data.count(self.sha)
            tail = data[-len(self.sha):]  # a sha cut between two reads counts once
            self.calls -= tail.count(self.sha)
            data = b""

    def stop(self) -> int:
        self.stopped = True
        self.thread.join(timeout=5)
        self.sock.close()
        return self.calls


def test_a_handler_reporting_progress_in_a_tight_loop_costs_redis_a_few_writes(
        sup, queue, redis_url):
    monitor = ScriptMonitor(redis_url, queue.scripts.progress.sha)
    try:
        job = queue.enqueue("steps.chatty", 3.0)
        calls = job.wait(timeout=30)
    finally:
        writes = monitor.stop()
    assert calls >= 100_000, calls  # the handler called progress that often...
    # ...and Redis saw at most one write per lease extension (lease_ttl 2s: every 0.67s)
    # plus the last one with the ack
    assert 1 <= writes <= 10, writes
    assert metric(sup, "forq_progress_writes_total", queue=queue.name) == writes
    assert queue.get(job.id).progress["message"] == f"{calls} calls"


def test_bad_progress_and_step_calls_raise_naming_the_argument(sup, queue):
    said = queue.enqueue("steps.bad_input").wait(timeout=20)
    assert said["over"].startswith("ValueError: progress must be from 0 to 1"), said
    assert said["nan"].startswith("ValueError: progress must be from 0 to 1"), said
    assert said["text"].startswith("TypeError: progress must be a number"), said
    assert said["long name"].startswith("ValueError: step name"), said
    assert said["not json"].startswith("StepError: step 's': result is not JSON"), said


def test_a_jobs_steps_are_capped_in_all_and_the_job_goes_dead(sup, queue):
    job = queue.enqueue("steps.too_much")
    done = wait_job(queue, job.id, ("dead", "succeeded"), context=sup.log)
    assert done.state == "dead" and done.attempts == 1, done.history  # fatal: no retry
    assert "a job's step results total at most 1048576 bytes" in done.reason, done.reason
    assert len(done.steps) == 17  # 17 × 60,002 bytes fit in 1 MiB, the 18th does not
    assert "Traceback" not in sup.log()


# -- the child's end, in process ---------------------------------------------------------------


def test_the_channel_throttles_progress_and_flushes_the_last():
    ours, theirs = socket.socketpair()
    clock = [0.0]
    channel = Channel(theirs.fileno(), interval=0.5, clock=lambda: clock[0])
    for i in range(1000):
        channel.progress(i / 1000, f"{i}")
    clock[0] = 0.6
    channel.progress(0.9, "later")
    channel.progress(0.95, "last")
    channel.flush()
    ours.settimeout(1)
    sent = ours.recv(65536).decode().splitlines()
    assert [line.split('"message":')[1] for line in sent] == ['"0"}', '"later"}', '"last"}']
    ours.close()
    theirs.close()


def test_a_step_answered_lost_raises_lease_lost():
    ours, theirs = socket.socketpair()
    channel = Channel(theirs.fileno(), {"done": "[1,2]"})
    assert channel.step("done", lambda: pytest.fail("a recorded step runs again")) == [1, 2]
    ours.sendall(b'{"step": "new", "answer": "lost"}\n')
    with pytest.raises(LeaseLost):
        channel.step("new", lambda: 3)
    ours.sendall(b'{"step": "other", "answer": "ok"}\n')
    assert channel.step("other", lambda: (4, 5)) == [4, 5]  # as a re-run would see it
    ours.close()
    with pytest.raises(LeaseLost, match="the supervisor is gone"):
        channel.step("after", lambda: 6)
    theirs.close()


def test_the_parent_checks_each_step_against_the_jobs_caps():
    """What a child that skips `Channel`'s own checks meets in the parent."""
    step = b'{"t":"step","name":"a","result":"' + b"r" * 1000 + b'"}\n'
    reader = MessageReader("j", 1 << 20, recorded_steps=0, recorded_bytes=(1 << 20) - 500)
    reader.feed(step)
    assert reader.violation == "step results over 1048576 bytes in all"
    reader = MessageReader("j", 1 << 20, recorded_steps=1000)
    reader.feed(step)
    assert reader.violation == "more than 1000 steps"
    reader = MessageReader("j", 1 << 20)
    reader.feed(step)
    assert not reader.violation and [s.name for s in reader.steps] == ["a"]
    reader.feed(step)  # before the parent answered the first
    assert reader.violation == "sent a step before its previous step was answered"


def test_outside_a_supervisor_a_step_just_runs(queue: Queue):
    channel = Channel(-1)
    assert channel.step("a", lambda: {"x": 1}) == {"x": 1}
    assert channel.step("a", lambda: pytest.fail("ran twice")) == {"x": 1}
    channel.progress(0.5)
    channel.flush()
