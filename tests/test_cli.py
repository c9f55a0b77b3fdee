"""The `forq` command, run as a user runs it: a subprocess against the real Redis.

Each test works in its own queue (the `queue` fixture), so tests never see each
other's jobs. Error paths assert the exit code, one line on stderr, no traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from forq import Queue
from forq.store.keys import SCHEDULES as SCHEDULES_KEY
from forq.supervisor.leases.calls import leasing
from forq.supervisor.redis_io.roster import Roster
from tests.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]
OWNER = "cli-test:1"
LONG = 60_000


class Forq:
    """Runs `forq ARGS...` as a subprocess with FORQ_REDIS_URL set to the test Redis."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url

    def _env(self, env: dict[str, str] | None, redis: bool) -> dict[str, str]:
        full = dict(os.environ, PYTHONPATH=str(ROOT))
        full.pop("FORQ_DEBUG", None)
        if redis:
            full["FORQ_REDIS_URL"] = self.redis_url
        else:
            full.pop("FORQ_REDIS_URL", None)
        full.update(env or {})
        return full

    def __call__(self, *args: str, env: dict[str, str] | None = None, redis: bool = True,
                 timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "forq.supervisor.cli", *args],
                              env=self._env(env, redis), cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)

    def many(self, *argvs: list[str]) -> list[subprocess.CompletedProcess[str]]:
        """Run independent invocations at once (start-up dominates their cost)."""
        procs = [(argv, subprocess.Popen([sys.executable, "-m", "forq.supervisor.cli", *argv],
                                         env=self._env(None, True), cwd=ROOT, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE))
                 for argv in argvs]
        done = []
        for argv, proc in procs:
            # they start together: on a loaded 2-core machine a dozen Python start-ups
            # take a while; the bound is for a hang, not for speed
            out, err = proc.communicate(timeout=90)
            done.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
        return done


@pytest.fixture
def forq(redis_url: str) -> Forq:
    return Forq(redis_url)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def ok_json(proc: subprocess.CompletedProcess[str]):
    return json.loads(ok(proc))


def one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def closed_port_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


def make_dead(queue: Queue, n: int, message: str = "boom") -> list[str]:
    ids = [queue.enqueue("tests.fails", i).id for i in range(n)]
    for lease in leasing(queue).claim(OWNER, n, LONG).leases:
        outcome = leasing(queue).fail(lease.id, lease.token, {"type": "ValueError", "message": message,
                                                     "traceback": "Traceback...\nValueError"},
                             mode="fatal")
        assert outcome.outcome == "dead"
    return ids


# -- enqueue ------------------------------------------------------------------------


def test_enqueue_prints_the_id_alone_and_stores_every_option(forq, queue):
    out = ok(forq("enqueue", "examples.add", "--args", "[1, 2]", "--kwargs", '{"x": 3}',
                  "-q", queue.name, "--priority", "7", "--key", "k-1"))
    job_id = out.strip()
    assert out == job_id + "\n"
    job = queue.get(job_id)
    assert (job.task, job.args, job.kwargs, job.state) == ("examples.add", [1, 2], {"x": 3},
                                                           "pending")
    assert job.fields["priority"] == 7 and job.fields["key"] == "k-1"
    # the same key again: the live job's id, and a note on stderr
    again = forq("enqueue", "examples.add", "-q", queue.name, "--key", "k-1")
    assert again.returncode == 0 and again.stdout.strip() == job_id
    assert "k-1" in again.stderr


def test_enqueue_with_delay_is_scheduled(forq, queue):
    job_id = ok(forq("enqueue", "examples.add", "-q", queue.name, "--delay", "30s")).strip()
    assert queue.get(job_id).state == "scheduled"


def test_enqueue_refuses_bad_input_in_one_line(forq, queue):
    cases = [
        (["--args", "[1,"], "--args is not valid JSON"),
        (["--args", '{"a": 1}'], "--args must be a JSON array"),
        (["--kwargs", "nope"], "--kwargs is not valid JSON"),
        (["--kwargs", "[1]"], "--kwargs must be a JSON object"),
        (["--delay", "3 fortnights"], "--delay"),
        (["--priority", "high"], "--priority"),
        (["-q", "bad:name"], "queue name"),
    ]
    procs = forq.many(*(["enqueue", "examples.add", "-q", queue.name, *args]
                        for args, _ in cases))
    for (_, needle), proc in zip(cases, procs, strict=True):
        one_line_error(proc, 2, needle)
        assert proc.stdout == ""
    assert queue.stats()["pending"] == 0


def test_enqueue_takes_every_option_of_the_api(forq, queue):
    out = ok_json(forq(
        "enqueue", "examples.add", "-q", queue.name, "--json", "--args", "[1]",
        "--kwargs", '{"b": 2}', "--priority", "-3", "--run-at", "2099-01-01T00:00:00Z",
        "--expire-at", "4102444800.5", "--key", "k-2", "--unique-for", "1h",
        "--job-id", "cli-all-options", "--max-attempts", "4", "--max-crashes", "2",
        "--timeout", "90s", "--memory-limit", "64MiB", "--result-ttl", "10m",
        "--max-result-bytes", "2KiB", "--backoff", '{"base": "1s", "factor": 3, "max": "1m", '
        '"jitter": 0.5}', "--idempotent", "--group", "g-1", "--no-durable"))
    assert out == {"id": "cli-all-options", "queue": queue.name, "task": "examples.add",
                   "status": "scheduled"}
    fields = queue.redis.hgetall(queue.keys.job("cli-all-options"))
    assert {k: fields.get(k) for k in (
        "priority", "run_at", "expire_at", "key", "max_attempts", "max_crashes", "timeout_ms",
        "memory_limit", "result_ttl_ms", "max_result_bytes", "backoff_base_ms",
        "backoff_factor", "backoff_max_ms", "backoff_jitter", "idempotent", "group")} == {
        "priority": "-3", "run_at": "4070908800000", "expire_at": "4102444800500",
        "key": "k-2", "max_attempts": "4", "max_crashes": "2", "timeout_ms": "90000",
        "memory_limit": str(64 << 20), "result_ttl_ms": "600000", "max_result_bytes": "2048",
        "backoff_base_ms": "1000", "backoff_factor": "3", "backoff_max_ms": "60000",
        "backoff_jitter": "0.5", "idempotent": "1", "group": "g-1"}
    job = queue.get("cli-all-options")
    assert (job.args, job.kwargs, job.state) == ([1], {"b": 2}, "scheduled")


def test_enqueue_depends_on_and_durable(forq, queue):
    parents = [ok(forq("enqueue", "examples.add", "-q", queue.name)).strip() for _ in range(2)]
    child = ok_json(forq("enqueue", "examples.add", "-q", queue.name, "--json",
                         "--depends-on", parents[0], "--depends-on", parents[1],
                         "--allow-failure"))
    assert child["status"] == "waiting"
    fields = queue.redis.hgetall(queue.keys.job(child["id"]))
    assert json.loads(fields["depends_on"]) == parents and fields["allow_failure"] == "1"
    # no replica here: the job is on the master, and the command says it was not replicated
    durable = forq("enqueue", "examples.add", "-q", queue.name, "--durable")
    one_line_error(durable, 1, "not replicated")


def test_enqueue_many_from_a_file_or_stdin(forq, queue, tmp_path):
    jobs = [{"task": "examples.add", "args": [i, 1], "priority": i} for i in range(3)]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    ids = ok(forq("enqueue", "-q", queue.name, "--jobs", str(tmp_path / "jobs.json"))).split()
    assert [queue.get(i).args for i in ids] == [[0, 1], [1, 1], [2, 1]]
    proc = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "enqueue", "-q",
                           queue.name, "--jobs", "-", "--json"], input=json.dumps(jobs[:2]),
                          env=forq._env(None, True), cwd=ROOT, capture_output=True, text=True,
                          timeout=20)
    described = ok_json(proc)
    assert [(d["task"], d["status"], d["queue"]) for d in described] == [
        ("examples.add", "pending", queue.name)] * 2
    assert queue.stats()["pending"] == 5


def test_enqueue_a_batch_with_callbacks(forq, queue, tmp_path):
    (tmp_path / "jobs.json").write_text(json.dumps([{"task": "examples.add", "args": [1, 2]},
                                                    {"task": "examples.add", "args": [3, 4]}]))
    out = ok_json(forq("enqueue", "-q", queue.name, "--jobs", str(tmp_path / "jobs.json"),
                       "--batch", "--batch-id", "cli-batch", "--on-success", "examples.add",
                       "--on-complete", '{"task": "examples.add", "args": [9], "priority": 2}',
                       "--json"))
    assert out == {"batch": "cli-batch", "queue": queue.name,
                   "members": ["cli-batch-1", "cli-batch-2"]}
    assert ok(forq("enqueue", "-q", queue.name, "--jobs", str(tmp_path / "jobs.json"),
                   "--batch")).strip() != "cli-batch"  # a new one, with its own id
    status = ok_json(forq("batch", "cli-batch", "--json"))
    assert (status["total"], sorted(status["callbacks"])) == (2, ["on_complete", "on_success"])


def test_enqueue_refuses_every_bad_option_in_one_line(forq, queue, tmp_path):
    files = {"missing": tmp_path / "missing.json", "bad": tmp_path / "bad.json",
             "object": tmp_path / "object.json", "strings": tmp_path / "strings.json",
             "unknown": tmp_path / "unknown.json", "empty": tmp_path / "empty.json"}
    files["bad"].write_text("[{")
    files["object"].write_text('{"task": "examples.add"}')
    files["strings"].write_text('["examples.add"]')
    files["unknown"].write_text('[{"task": "examples.add"}, {"task": "t", "colour": "red"}]')
    files["empty"].write_text("[]")
    one = ["enqueue", "examples.add", "-q", queue.name]
    many = ["enqueue", "-q", queue.name, "--jobs"]
    cases = [
        ([*one, "--run-at", "tomorrow"], "--run-at: expected a date and time"),
        ([*one, "--expire-at", "nan"], "--expire-at"),
        ([*one, "--unique-for", "soon", "--key", "k"], "--unique-for"),
        ([*one, "--timeout", "fast"], "--timeout"),
        ([*one, "--result-ttl=-1s"], "--result-ttl"),
        ([*one, "--memory-limit", "lots"], "--memory-limit"),
        ([*one, "--max-result-bytes", "1M"], "--max-result-bytes"),
        ([*one, "--max-attempts", "0"], "max_attempts must be at least 1"),
        ([*one, "--timeout", "0"], "timeout must be more than 0"),
        ([*one, "--max-attempts", "many"], "--max-attempts"),
        ([*one, "--max-crashes", "-1"], "max_crashes"),
        ([*one, "--priority", "5000"], "priority"),
        ([*one, "--backoff", "[1]"], "--backoff must be a JSON object"),
        ([*one, "--backoff", "{"], "--backoff is not valid JSON"),
        ([*one, "--backoff", '{"factor": "x"}'], "backoff.factor"),
        ([*one, "--backoff", '{"bse": "1s"}'], "unknown key(s) bse"),
        ([*one, "--depends-on", "nope"], "no job nope in queue"),
        ([*one, "--depends-on", ""], "depends_on[0]"),
        ([*one, "--allow-failure"], "allow_failure needs depends_on"),
        ([*one, "--job-id", ""], "--job-id must not be empty"),
        ([*one, "--key", ""], "--key must not be empty"),
        ([*one, "--expires-in", "1h", "--expire-at", "4102444800"], "not both"),
        ([*one, "--group", "x" * 300], "group"),
        ([*one, "--batch"], "--batch needs --jobs"),
        ([*one, "--on-success", "t"], "--on-success needs --jobs"),
        ([*one, "--jobs", str(files["empty"])], "a TASK or --jobs, not both"),
        ([*many, str(files["missing"])], "--jobs: cannot read"),
        ([*many, str(files["bad"])], "not valid JSON"),
        ([*many, str(files["object"])], "must be a JSON array of jobs"),
        ([*many, str(files["strings"])], "jobs[0] must be an object"),
        ([*many, str(files["unknown"])], "jobs[1]: task 't': unknown option(s) colour"),
        ([*many, str(files["empty"])], "no jobs in it"),
        ([*many, str(files["empty"]), "--max-attempts", "3"], "--max-attempts is an option"),
        ([*many, str(files["empty"]), "--on-complete", "t"], "--on-complete needs --batch"),
        ([*many, str(files["empty"]), "--batch"], "batch: jobs is empty"),
        ([*many, str(files["unknown"]), "--batch"], "jobs[1]"),
        ([*many, str(files["unknown"]), "--batch", "--durable"], "--durable"),
        ([*many, str(files["unknown"]), "--batch", "--on-success", "{"], "--on-success is not"),
        ([*many, str(files["unknown"]), "--batch", "--batch-id", "b" * 201], "batch_id"),
    ]
    for (argv, needle), proc in zip(cases, forq.many(*(argv for argv, _ in cases)), strict=True):
        line = one_line_error(proc, 2, needle)
        assert proc.stdout == "", (argv, line)
    stats = queue.stats()
    assert stats["pending"] == stats["scheduled"] == 0


# -- Redis selection and unreachable Redis --------------------------------------------


def test_unreachable_redis_is_one_line_and_exit_1(forq):
    url = closed_port_url()
    argvs = [["stats"], ["stats", "--json"], ["job", "abc"], ["workers"],
             ["enqueue", "examples.add"], ["dead", "list", "-q", "q"], ["cancel", "abc"],
             ["limit", "q"], ["stats", "--watch"]]
    for proc in forq.many(*(["--redis", url, *argv] for argv in argvs)):
        one_line_error(proc, 1, "cannot reach Redis")


def test_redis_flag_beats_the_environment_and_works_after_the_command(forq, queue, redis_url):
    queue.enqueue("examples.add")
    bad = {"FORQ_REDIS_URL": closed_port_url()}
    before = ok_json(forq("--redis", redis_url, "stats", "--json", "-q", queue.name, env=bad))
    after = ok_json(forq("stats", "--json", "-q", queue.name, "--redis", redis_url, env=bad))
    assert before[queue.name]["pending"] == after[queue.name]["pending"] == 1


def test_redis_url_from_the_config_when_nothing_else_says(forq, queue, redis_url, tmp_path):
    queue.enqueue("examples.add")
    config = tmp_path / "forq.toml"
    config.write_text(f'[redis]\nurl = "{redis_url}"\n[[queue]]\nname = "q"\nconcurrency = 1\n')
    stats = ok_json(forq("stats", "--json", "-q", queue.name, "-c", str(config), redis=False))
    assert stats[queue.name]["pending"] == 1


def test_bad_redis_url_and_bad_config_are_one_line(forq, tmp_path):
    url, config = forq.many(["--redis", "http://nowhere", "stats"],
                            ["stats", "-c", str(tmp_path / "missing.toml")])
    one_line_error(url, 2, "Redis URL")
    one_line_error(config, 2, "missing.toml")


def test_usage_errors_are_one_line(forq):
    frob, dead, enqueue = forq.many(["frobnicate"], ["dead"], ["enqueue"])
    one_line_error(frob, 2, "invalid choice")
    one_line_error(dead, 2)
    one_line_error(enqueue, 2, "task")


# -- stats ----------------------------------------------------------------------------


def test_stats_table_and_json(forq, queue):
    make_dead(queue, 1)
    queue.enqueue("examples.add")
    queue.enqueue("examples.add", delay="1h")
    lease = leasing(queue).claim(OWNER, 1, LONG).leases[0]
    leasing(queue).ack(lease.id, lease.token, "3")
    queue.enqueue("examples.add")

    every, only, text = forq.many(["stats", "--json"], ["stats", "--json", "-q", queue.name],
                                  ["stats", "-q", queue.name])
    mine = ok_json(every)[queue.name]
    assert {k: mine[k] for k in ("pending", "scheduled", "active", "dead", "succeeded")} == {
        "pending": 1, "scheduled": 1, "active": 0, "dead": 1, "succeeded": 1}
    assert mine["last_minute"]["succeeded"] == 1
    assert mine["oldest_pending_age"] is not None

    assert list(ok_json(only)) == [queue.name]

    header, row = ok(text).splitlines()
    assert header.split() == ["queue", "pending", "scheduled", "active", "dead", "ok/1m",
                              "failed/1m", "oldest", "kept-ok", "kept-bytes"]
    assert row.split()[:7] == [queue.name, "1", "1", "0", "1", "1", "1"]
    assert row.split()[-2] == "1"  # the succeeded record kept (docs/operations/retention.md)
    kept = mine["retained"]
    assert kept["succeeded"]["count"] == 1 and kept["dead"]["count"] == 1
    assert 100 < kept["succeeded"]["bytes"] < 5000 and kept["dead"]["bytes"] > 100


def _watch(redis_url: str, *args: str, command: tuple[str, ...] = ("stats", "--watch")
           ) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), FORQ_REDIS_URL=redis_url)
    # Ctrl-C's default, whatever this test run inherited: a shell's background job starts
    # with SIGINT ignored, and Python then never raises KeyboardInterrupt
    return subprocess.Popen([sys.executable, "-m", "forq.supervisor.cli", *command, *args],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.timeout(20)
def test_stats_watch_in_a_pipe_prints_plain_frames_until_ctrl_c(redis_url, queue):
    """Not a terminal: frame after frame of the plain table, no escape codes (a log of
    `forq stats --watch > file` reads as text)."""
    queue.enqueue("examples.add")
    proc = _watch(redis_url, "-q", queue.name, "--interval", "50ms")
    try:
        seen = []
        while sum(line.startswith("forq stats ") for line in seen) < 3:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            seen.append(line)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    text = "".join(seen) + out
    assert "\x1b" not in text
    rows = [line.split() for line in text.splitlines() if line.startswith(queue.name)]
    assert len(rows) >= 2 and all(row[:2] == [queue.name, "1"] for row in rows), text


@pytest.mark.timeout(20)
def test_stats_watch_json_is_one_object_per_line(redis_url, queue):
    queue.enqueue("examples.add")
    proc = _watch(redis_url, "-q", queue.name, "--interval", "0.05", "--json")
    try:
        frames = [json.loads(proc.stdout.readline()) for _ in range(2)]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert all(f["queues"][queue.name]["pending"] == 1 for f in frames)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("json_mode", [False, True], ids=["plain", "json"])
def test_top_watches_as_stats_does_until_ctrl_c(redis_url, queue, json_mode):
    """`forq top` without --once: frames in a pipe (no escape codes), or JSON lines."""
    proc = _watch(redis_url, "-q", queue.name, "--interval", "50ms",
                  *(["--json"] if json_mode else []), command=("top",))
    try:
        if json_mode:
            frames = [json.loads(proc.stdout.readline()) for _ in range(2)]
            assert all(f["jobs"] == [] for f in frames), frames
        else:
            seen: list[str] = []
            while sum(line.startswith("forq top ") for line in seen) < 2:
                line = proc.stdout.readline()
                assert line, proc.stderr.read()
                seen.append(line)
            assert "no job running" in "".join(seen) and "\x1b" not in "".join(seen)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err


def test_stats_watch_bad_interval(forq):
    for proc in forq.many(["stats", "--watch", "--interval", "soon"],
                          ["stats", "--watch", "--interval", "0"]):
        one_line_error(proc, 2, "--interval")


# -- job ------------------------------------------------------------------------------


def test_job_json_shape_and_history(forq, queue):
    job_id = queue.enqueue("examples.add", 1, 2, keep_history=True).id
    lease = leasing(queue).claim(OWNER, 1, LONG).leases[0]
    leasing(queue).ack(lease.id, lease.token, json.dumps(3))
    as_json, as_text = forq.many(["job", job_id, "--json"], ["job", job_id])
    data = ok_json(as_json)
    for key in ("id", "queue", "task", "state", "attempts", "crashes", "history", "result",
                "error"):
        assert key in data
    assert (data["id"], data["queue"], data["state"], data["result"]) == (
        job_id, queue.name, "succeeded", 3)
    events = [e["event"] for e in data["history"]]
    assert events[0] == "enqueued" and events[-1] == "succeeded"
    assert all(isinstance(e["at"], float) and e["at"] > 1e9 for e in data["history"])

    text = ok(as_text)
    assert f"job {job_id}" in text and "succeeded" in text and "history" in text
    assert "enqueued" in text and OWNER in text


def test_job_unknown_id_is_exit_1(forq, queue):
    for proc in forq.many(["job", "no-such-job-" + uuid.uuid4().hex],
                          ["job", "no-such-job", "--json"]):
        one_line_error(proc, 1, "no job")


# -- dead -----------------------------------------------------------------------------


def test_dead_list_table_and_json(forq, queue):
    ids = make_dead(queue, 3, message="kaput")
    full, limited, text = forq.many(["dead", "list", "-q", queue.name, "--json"],
                                    ["dead", "list", "-q", queue.name, "--json", "--limit", "2"],
                                    ["dead", "list", "-q", queue.name])
    data = ok_json(full)
    assert data["queue"] == queue.name and data["total"] == 3
    assert sorted(j["id"] for j in data["jobs"]) == sorted(ids)
    first = data["jobs"][0]
    assert set(first) == {"id", "task", "reason", "died_at", "attempts", "crashes"}
    assert first["task"] == "tests.fails" and "kaput" in first["reason"]
    assert first["attempts"] == 1 and first["crashes"] == 0
    assert first["died_at"] > 1e9

    limited = ok_json(limited)
    assert len(limited["jobs"]) == 2 and limited["total"] == 3

    text = ok(text)
    assert text.splitlines()[0].split() == ["id", "task", "reason", "died", "attempts",
                                            "crashes"]
    assert all(i in text for i in ids) and "kaput" in text


def test_dead_list_empty_and_missing_queue_flag(forq, queue):
    assert "no dead jobs" in ok(forq("dead", "list", "-q", queue.name))
    one_line_error(forq("dead", "list"), 2, "-q")


def test_dead_show(forq, queue):
    (dead_id,) = make_dead(queue, 1, message="exploded")
    text = ok(forq("dead", "show", "-q", queue.name, dead_id))
    assert dead_id in text and "exploded" in text and "traceback" in text
    data = ok_json(forq("dead", "show", dead_id, "--json"))  # queue found by id
    assert data["state"] == "dead" and data["error"]["message"] == "exploded"
    assert data["died_at"] > 1e9

    alive = queue.enqueue("examples.add").id
    one_line_error(forq("dead", "show", "-q", queue.name, alive), 1, "pending, not dead")
    one_line_error(forq("dead", "show", "-q", queue.name, "nope"), 1, "no job")


def test_dead_requeue_by_id_reports_the_ids_that_were_not_dead(forq, queue):
    a, b = make_dead(queue, 2)
    data = ok_json(forq("dead", "requeue", "-q", queue.name, a, "--json"))
    assert data == {"queue": queue.name, "requeued": 1, "not_dead": []}
    job = queue.get(a)
    assert job.state == "pending" and job.attempts == 0

    proc = forq("dead", "requeue", "-q", queue.name, a, b)
    one_line_error(proc, 1, "not dead", a)
    assert "requeued 1" in proc.stdout
    assert queue.get(b).state == "pending"


def test_dead_requeue_and_purge_all(forq, queue):
    make_dead(queue, 3)
    assert "requeued 3" in ok(forq("dead", "requeue", "-q", queue.name, "--all"))
    assert queue.stats()["pending"] == 3 and queue.stats()["dead"] == 0

    leases = leasing(queue).claim(OWNER, 3, LONG).leases
    for lease in leases:
        leasing(queue).fail(lease.id, lease.token, {"message": "x"}, mode="fatal")
    ids = [lease.id for lease in leases]
    data = ok_json(forq("dead", "purge", "-q", queue.name, "--all", "--json"))
    assert data == {"queue": queue.name, "purged": 3, "not_dead": []}
    assert queue.stats()["dead"] == 0
    one_line_error(forq("job", ids[0]), 1, "no job")


def test_dead_purge_by_id(forq, queue):
    a, b = make_dead(queue, 2)
    alive = queue.enqueue("examples.add").id
    proc = forq("dead", "purge", "-q", queue.name, a, alive, "--json")
    one_line_error(proc, 1, alive)
    assert json.loads(proc.stdout) == {"queue": queue.name, "purged": 1, "not_dead": [alive]}
    assert queue.stats()["dead"] == 1 and queue.get(alive).state == "pending"


def test_dead_requeue_and_purge_refuse_without_ids_or_all(forq, queue):
    make_dead(queue, 1)
    for verb in ("requeue", "purge"):
        neither, both = forq.many(["dead", verb, "-q", queue.name],
                                  ["dead", verb, "-q", queue.name, "x", "--all"])
        one_line_error(neither, 2, "--all")
        one_line_error(both, 2, "not both")
    assert queue.stats()["dead"] == 1


# -- supervisors ----------------------------------------------------------------------


def test_supervisors_lists_live_supervisors(forq, r, queue):
    sid = "cli-test-" + uuid.uuid4().hex[:8]
    registry = Roster(r, sid)
    registry.beat({"name": sid, "host": "box-1", "pid": 4242, "queues": [queue.name],
                   "busy": 2, "slots": 4, "draining": False})
    try:
        as_json, as_text, alias = forq.many(["supervisors", "--json"], ["supervisors"],
                                            ["workers"])
        records = ok_json(as_json)
        mine = next(rec for rec in records if rec.get("id") == sid)
        assert (mine["name"], mine["host"], mine["pid"], mine["busy"], mine["slots"]) == (
            sid, "box-1", 4242, 2, 4)
        assert mine["version"] and mine["draining"] is False and 0 <= mine["age"] < 10
        text = ok(as_text)
        line = next(row for row in text.splitlines() if row.startswith(sid))
        assert "box-1" in line and "4242" in line and "2/4" in line and queue.name in line
        assert text.splitlines()[0].split()[:7] == ["name", "host", "pid", "forq", "code",
                                                    "queues", "busy"]
        assert "?" in line.split()  # it said nothing of its code: not known
        # `forq workers`, the older name: the same table (heartbeat ages aside)
        same = ok(alias).splitlines()
        assert same[0] == text.splitlines()[0] and any(row.startswith(sid) for row in same)
    finally:
        registry.leave()


def test_supervisors_shows_the_code_each_serves_and_survives_garbled_records(forq, r, queue):
    """The code column and its notes (an old fork server finishing jobs, a refused
    reload); a record someone else wrote into the roster is shown as far as it reads."""
    sid, junk = ("cli-code-" + uuid.uuid4().hex[:8] for _ in range(2))
    good, bad = Roster(r, sid), Roster(r, junk)
    good.beat({"name": sid, "queues": [queue.name], "code": "v7+0123456789ab",
               "code_retiring": [{"code": "v6+ba9876543210", "pid": 77, "jobs": 2}],
               "reload_error": {"at": 1_700_000_000.0, "module": "app.tasks",
                                "error": "cannot import handler module app.tasks: "
                                         "SyntaxError: invalid syntax (tasks.py, line 3)"}})
    bad.beat({"name": junk, "code": {"x": 1}, "code_retiring": ["x", {"pid": "1", "jobs": 1},
                                                                 {"pid": 1, "jobs": -4}],
              "reload_error": [1, 2]})
    try:
        text = ok(forq("supervisors"))
        line = next(row for row in text.splitlines() if row.startswith(sid))
        assert "v7+0123456789ab (+2 on old) (reload refused)" in line, text
        assert f"{sid}: old fork server 77 finishing 2 job(s) in code v6+ba9876543210" in text
        refused = next(row for row in text.splitlines() if "reload refused at" in row)
        assert refused.startswith(f"{sid}: reload refused at ") and "SyntaxError" in refused
        assert refused.endswith("still serving code v7+0123456789ab"), refused
        junk_line = next(row for row in text.splitlines() if row.startswith(junk))
        assert " ? " in junk_line and "old" not in junk_line, junk_line
        assert not [row for row in text.splitlines() if row.startswith(f"{junk}:")], text
    finally:
        good.leave()
        bad.leave()


# -- schedules ------------------------------------------------------------------------


def test_schedules_last_and_next_fire(forq, r, queue, tmp_path):
    fired, never = f"{queue.name}-fired", f"{queue.name}-never"
    config = tmp_path / "forq.toml"
    config.write_text(textwrap.dedent(f"""
        [[queue]]
        name = "{queue.name}"
        concurrency = 1

        [[schedule]]
        name = "{fired}"
        cron = "0 3 * * *"
        timezone = "Europe/Paris"
        queue = "{queue.name}"
        task = "reports.nightly"

        [[schedule]]
        name = "{never}"
        cron = "@every 30s"
        queue = "{queue.name}"
        task = "examples.tick"
    """))
    last = int(time.time()) - 120
    r.hset(SCHEDULES_KEY, fired, json.dumps({"last": last, "job": "job-123"}))
    try:
        before = time.time()
        as_json, as_text = forq.many(["schedules", "--json", "--config", str(config)],
                                     ["schedules", "-c", str(config)])
        rows = ok_json(as_json)
        assert [row["name"] for row in rows] == [fired, never]
        a, b = rows
        assert (a["cron"], a["timezone"], a["queue"], a["task"]) == (
            "0 3 * * *", "Europe/Paris", queue.name, "reports.nightly")
        assert a["last_fired"] == last and a["last_job"] == "job-123"
        assert b["last_fired"] is None and b["last_job"] is None
        after = time.time()
        assert before < a["next_fire"] <= after + 86400 + 3600
        assert before < b["next_fire"] <= after + 30 and b["next_fire"] % 30 == 0

        text = ok(as_text)
        fired_line = next(line for line in text.splitlines() if line.startswith(fired))
        never_line = next(line for line in text.splitlines() if line.startswith(never))
        assert "ago" in fired_line and "CE" in fired_line  # CET/CEST: Paris time
        assert " - " in never_line and "in " in never_line
    finally:
        r.hdel(SCHEDULES_KEY, fired)


def test_schedules_bad_config_is_one_line(forq, tmp_path):
    one_line_error(forq("schedules", "-c", str(tmp_path / "nope.toml")), 2, "nope.toml")


# -- cancel ---------------------------------------------------------------------------


def test_cancel_pending_active_and_finished(forq, queue):
    pending = queue.enqueue("examples.add").id
    assert "cancelled job" in ok(forq("cancel", pending))
    assert queue.get(pending).state == "cancelled"

    active = queue.enqueue("examples.add").id
    assert leasing(queue).claim(OWNER, 1, LONG).leases[0].id == active
    data = ok_json(forq("cancel", active, "--json"))
    assert data == {"id": active, "queue": queue.name, "outcome": "cancelling", "state": "active"}
    assert "cancel_requested" in queue.get(active).fields
    assert "supervisor will stop it" in ok(forq("cancel", active, "-q", queue.name))

    again = ok_json(forq("cancel", pending, "--json"))
    assert again["outcome"] == "cancelled"
    done = queue.enqueue("examples.add").id
    lease = leasing(queue).claim(OWNER, 1, LONG).leases[0]
    leasing(queue).ack(lease.id, lease.token, "1")
    assert "already succeeded" in ok(forq("cancel", done))


def test_cancel_unknown_id(forq, queue):
    for proc in forq.many(["cancel", "no-such-job"],
                          ["cancel", "no-such-job", "-q", queue.name, "--json"]):
        one_line_error(proc, 1, "no job")


# -- limit ----------------------------------------------------------------------------


def test_limit_show_set_and_remove(forq, queue):
    empty = ok_json(forq("limit", queue.name, "--json"))
    assert empty == {"queue": queue.name, "rate": None, "rate_per_second": None, "burst": None,
                     "max_in_flight": None, "group_concurrency": 1, "group_rate": None,
                     "group_rate_per_second": None}
    assert "rate none, max_in_flight none" in ok(forq("limit", queue.name))

    set_ = ok_json(forq("limit", queue.name, "--rate", "50/s", "--max-in-flight", "10", "--json"))
    assert set_["rate"] == "50/s" and set_["rate_per_second"] == pytest.approx(50)
    assert set_["max_in_flight"] == 10
    assert queue.limits()["max_in_flight"] == 10

    text = ok(forq("limit", queue.name, "--rate", "30/m"))  # only the rate changes
    assert "rate 30/m" in text and "max_in_flight 10" in text

    cleared = ok_json(forq("limit", queue.name, "--rate", "none", "--json"))
    assert cleared["rate"] is None and cleared["max_in_flight"] == 10
    cleared = ok_json(forq("limit", queue.name, "--max-in-flight", "none", "--json"))
    assert cleared["max_in_flight"] is None and queue.limits() == {}


def test_limit_bad_values(forq, queue):
    cases = [(["--rate", "fast"], "--rate"), (["--rate", "5"], "--rate"),
             (["--rate", "0/s"], "--rate"), (["--max-in-flight", "0"], "--max-in-flight"),
             (["--max-in-flight", "lots"], "--max-in-flight")]
    procs = forq.many(*(["limit", queue.name, *args] for args, _ in cases))
    for (_, needle), proc in zip(cases, procs, strict=True):
        one_line_error(proc, 2, needle)
    assert queue.limits() == {}


# -- config check, run ----------------------------------------------------------------


def test_config_check(forq, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[queue]]\nname = "q"\nconcurrency = "many"\n')
    good, wrong = forq.many(["config", "check", str(ROOT / "etc" / "forq.toml")],
                            ["config", "check", str(bad)])
    assert ok(good).startswith("ok:")
    one_line_error(wrong, 2, "concurrency")


def test_run_with_a_missing_config_is_one_line(forq, tmp_path):
    one_line_error(forq("run", "-c", str(tmp_path / "absent.toml")), 2, "absent.toml")


def test_a_handler_module_by_its_old_name_says_what_it_is_called_now(tmp_path, redis_url):
    """0.2 installs one package, `forq`: `jobs.examples` is `forq.examples` now."""
    from tests.supervisors import write_config

    config = write_config(tmp_path / "forq.toml", redis_url, {"old-names": 1},
                          imports=("jobs.examples",))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FORQ_REDIS_URL")}
    # outside the checkout, where jobs/ is no package (as for a user of the wheel)
    proc = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "run", "--config",
                           str(config)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=20)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "`jobs` is now `forq`" in proc.stderr and "forq.examples" in proc.stderr
