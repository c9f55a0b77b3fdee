"""`forq replay ID`: a finished job run again here, under its config's limits and
sandbox, its output on the terminal, and nothing written to Redis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from forq.supervisor.leases.calls import leasing
from tests.supervisors import REPO, write_config

OWNER = "replay-test:1"


def snapshot(queue) -> dict:
    """Every key of the queue with its whole content: what "nothing written" compares."""
    r, out = queue.redis, {}
    for key in sorted(r.scan_iter(match=f"forq:{{{queue.name}}}:*")):
        kind = r.type(key)
        out[key] = (kind, r.hgetall(key) if kind == "hash" else
                    r.zrange(key, 0, -1, withscores=True) if kind == "zset" else
                    r.lrange(key, 0, -1) if kind == "list" else
                    sorted(r.smembers(key)) if kind == "set" else
                    r.xrange(key) if kind == "stream" else r.get(key))
    return out


def replay(config: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "replay", *args,
                           "--config", str(config)], cwd=REPO, capture_output=True, text=True,
                          input=stdin, timeout=60)


@pytest.fixture
def config(tmp_path, redis_url, queue):
    return write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1},
                        imports=("tests.replay_tasks",), timeout="1s")


def dead_job(queue, *args, task="replay.charge_then_fail"):
    job = queue.enqueue(task, *args)
    (lease,) = leasing(queue).claim(OWNER, 1, 60_000).leases
    leasing(queue).fail(lease.id, lease.token, {"message": "x", "reason": "refused"},
                        mode="fatal")
    assert queue.get(job.id).state == "dead"
    return job


def test_a_dead_job_runs_again_here_and_nothing_is_written(config, queue, tmp_path):
    marks = tmp_path / "marks"
    job = dead_job(queue, str(marks))
    before = snapshot(queue)
    proc = replay(config, job.id)
    assert proc.returncode == 1, proc.stderr
    assert "hello from the handler" in proc.stdout  # its output on the terminal
    assert f"replay of {job.id}: failed: ValueError: refused after charge 1" in proc.stdout
    assert "step 'charge' taken (not recorded" in proc.stderr
    assert "Traceback" in proc.stderr and "refused after charge" in proc.stderr
    assert marks.read_text() == "charged\n"  # the step ran: it had no recorded result
    assert snapshot(queue) == before  # not a field, not a history entry, not a key


def test_a_recorded_step_is_not_run_again(config, queue, tmp_path):
    marks = tmp_path / "marks"
    job = queue.enqueue("replay.charge_then_fail", str(marks))
    (lease,) = leasing(queue).claim(OWNER, 1, 60_000).leases
    assert leasing(queue).record_step(job.id, lease.token, "charge", "7") == "ok"
    proc = replay(config, job.id)
    assert "refused after charge 7" in proc.stdout, proc.stderr
    assert not marks.exists()


def test_a_dependent_replayed_reads_its_parents_results(config, queue):
    parent = queue.enqueue("x.y")
    (lease,) = leasing(queue).claim(OWNER, 1, 60_000).leases
    assert leasing(queue).ack(lease.id, lease.token, '{"rows": 3}') == "ok"
    job = queue.enqueue("replay.parents", depends_on=[parent])
    before = snapshot(queue)
    proc = replay(config, job.id)
    assert proc.returncode == 0, proc.stderr
    assert f'parents: {{"{parent.id}": {{"rows": 3}}}}' in proc.stdout
    assert snapshot(queue) == before


def test_its_time_limit_holds(config, queue):
    job = queue.enqueue("replay.sleep", 30)  # the config's timeout is 1s
    proc = replay(config, job.id, "--json")
    assert proc.returncode == 1
    assert '"outcome": "timeout"' in proc.stdout, proc.stdout


def test_pdb_stops_at_the_handlers_exception(config, queue, tmp_path):
    job = dead_job(queue, str(tmp_path / "marks"))
    proc = replay(config, job.id, "--pdb", stdin="p 'charged=%d' % charged\nq\n")
    assert "(Pdb)" in proc.stdout and "'charged=1'" in proc.stdout, proc.stdout


@pytest.mark.parametrize("argv, needle", [
    (["replay", "no-such-job"], "no job with id no-such-job"),
    (["replay", "x", "--queue", ""], ""),
])
def test_bad_input_is_one_line(config, argv, needle):
    proc = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", *argv, "--config",
                           str(config)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_without_a_config_it_says_what_it_needs(redis_url):
    proc = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "replay", "x"],
                          cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"FORQ_REDIS_URL": redis_url, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "needs --config" in proc.stderr, proc.stderr
