"""Admission by memory (`[supervisor] memory_budget`, supervisor/children/budget.py) with
real supervisors: the memory limits of the children running at once never add up to
more than the budget; a big job that does not fit waits, held, while the smaller jobs
behind it run; it starts once room frees; after `memory_reserve_after` its size is
reserved and smaller jobs stop passing it; a job over the whole budget is snoozed (no
attempt), visible in the heartbeat, `forq stats` and the dashboard, and runs on a
supervisor with room.

`tests.gated` writes "ID start" / "ID end" to a log and runs until its gate file
exists: the test sees which jobs ran at the same time and decides when each ends.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from forq import Queue
from forq.fleet import live_supervisors
from forq.supervisor.config.load import ConfigError, load_config
from tests.helpers import wait_for, wait_job
from tests.redis_server import free_port
from tests.supervisors import REPO, SupervisorProcess, write_config
from tests.test_job_cost import sample, scrape
from tests.web_server import WebProcess

MiB = 1 << 20


def config(tmp_path: Path, redis_url: str, queue: Queue, budget: str | None,
           concurrency: int = 6, name: str = "", metrics_port: int = 0) -> Path:
    # a job waiting for room reserves it after 2 s here (10 s by default)
    extra = f'memory_budget = "{budget}"\nmemory_reserve_after = "2s"' if budget else ""
    path = write_config(tmp_path / f"forq{name}.toml", redis_url, {queue.name: concurrency},
                        memory_limit="64MiB", supervisor_extra=extra, name=name)
    if metrics_port:
        path.write_text(path.read_text().replace(
            'listen = ""', f'listen = "127.0.0.1:{metrics_port}"'))
    return path


def memory_metrics(port: int, queue: Queue) -> dict[str, float]:
    """The memory budget's samples on the supervisor's real /metrics endpoint."""
    got = scrape(port)
    out = {name: sample(got, name)[0][1] for name in ("forq_memory_budget_bytes",
                                                      "forq_memory_refused_total")
           if sample(got, name)}
    for state in ("running", "held"):
        for _labels, value in sample(got, "forq_memory_admitted_bytes", state=state):
            out[state] = value
    for _labels, value in sample(got, "forq_jobs_waiting_for_memory", queue=queue.name):
        out["waiting"] = value
    return out


def gated(queue: Queue, log: Path, gate: Path, limit: str | int) -> dict:
    return {"task": "tests.gated", "args": [str(log), str(gate)], "memory_limit": limit}


def lines(log: Path) -> list[tuple[str, str]]:
    return [tuple(line.split()) for line in log.read_text().splitlines()] if log.exists() else []


def started(log: Path) -> list[str]:
    return [job for job, what in lines(log) if what == "start"]


def peak(log: Path, limits: dict[str, int]) -> int:
    """The largest sum of memory limits of jobs running at the same time, by the log."""
    running: set[str] = set()
    most = 0
    for job, what in lines(log):
        (running.add if what == "start" else running.discard)(job)
        most = max(most, sum(limits[j] for j in running))
    return most


def until(predicate, message: str, sup: SupervisorProcess, timeout: float = 15.0) -> None:
    try:
        wait_for(predicate, timeout=timeout, message=message)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{sup.log()[-3000:]}") from None


def record(queue: Queue) -> dict:
    records = live_supervisors(queue.redis)
    return records[0] if records else {}


@pytest.mark.timeout(90)
def test_budget_caps_running_limits_small_jobs_pass_the_big_one(tmp_path, redis_url, queue):
    log = tmp_path / "log"
    gates = {name: tmp_path / name for name in ("big1", "big2", "small")}
    port = free_port()
    with SupervisorProcess(config(tmp_path, redis_url, queue, "1GiB",
                                  metrics_port=port)).start() as sup:
        # one claim: big1 fits, big2 does not (600 + 600 > 1024), the smalls behind it do
        jobs = queue.enqueue_many([gated(queue, log, gates["big1"], "600MiB"),
                                   gated(queue, log, gates["big2"], "600MiB")]
                                  + [gated(queue, log, gates["small"], "100MiB")] * 4)
        ids = [job.id for job in jobs]
        big1, big2, smalls = ids[0], ids[1], ids[2:]
        limits = dict(zip(ids, [600 * MiB] * 2 + [100 * MiB] * 4, strict=True))
        until(lambda: set(started(log)) == {big1, *smalls}, "big1 and the smalls run", sup)
        # big2 waits leased here (held, its lease extended), never started
        assert queue.get(big2).state == "active" and big2 not in started(log)
        until(lambda: [w[0] for w in record(queue).get("memory_waiting", [])] == [big2],
              "the heartbeat lists big2 waiting for memory", sup)
        rec = record(queue)
        assert rec["memory_budget"] == 1 << 30 and rec["memory_used"] == 1000 * MiB
        # and Prometheus sees the same: the budget, the running limits, big2 held waiting
        assert memory_metrics(port, queue) == {
            "forq_memory_budget_bytes": 1 << 30, "forq_memory_refused_total": 0,
            "running": 1000 * MiB, "held": 600 * MiB, "waiting": 1}

        gates["small"].touch()  # the smalls end: 424 MiB free, still not room for big2
        until(lambda: sum(1 for _j, what in lines(log) if what == "end") == 4, "smalls end",
              sup)
        for job_id in smalls:
            assert wait_job(queue, job_id, ("succeeded",)).state == "succeeded"
        assert big2 not in started(log)

        gates["big1"].touch()  # big1 ends: big2 starts
        until(lambda: big2 in started(log), "big2 starts once big1 ended", sup)
        gates["big2"].touch()
        for job_id in ids:
            job = wait_job(queue, job_id, ("succeeded", "dead"))
            assert job.state == "succeeded" and (job.attempts, job.crashes) == (1, 0)
        assert lines(log).index((big2, "start")) > lines(log).index((big1, "end"))
        assert peak(log, limits) <= 1 << 30
        assert peak(log, limits) == 1000 * MiB  # and it was used: 600 + 4 x 100
        until(lambda: memory_metrics(port, queue).get("running") == 0, "nothing counted", sup)
        assert memory_metrics(port, queue) == {
            "forq_memory_budget_bytes": 1 << 30, "forq_memory_refused_total": 0,
            "running": 0, "held": 0, "waiting": 0}


@pytest.mark.timeout(90)
def test_a_big_job_waiting_past_reserve_after_is_not_passed(tmp_path, redis_url, queue):
    log, gate1, gate2 = tmp_path / "log", tmp_path / "g1", tmp_path / "g2"
    with SupervisorProcess(config(tmp_path, redis_url, queue, "1GiB")).start() as sup:
        big1, big2 = (job.id for job in queue.enqueue_many(
            [gated(queue, log, gate1, "600MiB"), gated(queue, log, gate2, "600MiB")]))
        until(lambda: started(log) == [big1], "big1 runs", sup)
        until(lambda: any(w[0] == big2 and w[3] >= 2.0
                          for w in record(queue).get("memory_waiting", [])),
              "big2 waited 2 s", sup)
        # 600 + 100 fits the budget, but not beside big2's reservation: not even claimed
        small = queue.enqueue_many([gated(queue, log, gate2, "100MiB")])[0].id
        beat = record(queue)["heartbeat"]
        until(lambda: record(queue).get("heartbeat", 0) > beat, "a heartbeat later", sup)
        assert queue.get(small).state == "pending" and started(log) == [big1]
        gate1.touch()
        until(lambda: set(started(log)) == {big1, big2, small}, "both start", sup)
        assert started(log) == [big1, big2, small]  # the one waiting longest first
        gate2.touch()
        for job_id in (big1, big2, small):
            assert wait_job(queue, job_id, ("succeeded", "dead")).state == "succeeded"


@pytest.mark.timeout(90)
def test_a_job_without_a_limit_counts_as_the_whole_budget(tmp_path, redis_url, queue):
    log, gate = tmp_path / "log", tmp_path / "gate"
    with SupervisorProcess(config(tmp_path, redis_url, queue, "1GiB")).start() as sup:
        small = queue.enqueue_many([gated(queue, log, gate, "100MiB")])[0].id
        until(lambda: started(log) == [small], "the small job runs", sup)
        unlimited = queue.enqueue_many([gated(queue, log, gate, 0)])[0].id
        until(lambda: unlimited in [w[0] for w in record(queue).get("memory_waiting", [])],
              "the job without a limit waits", sup)
        gate.touch()
        assert wait_job(queue, unlimited, ("succeeded", "dead")).state == "succeeded"
        assert lines(log)[:3] == [(small, "start"), (small, "end"), (unlimited, "start")]
        assert "count as the whole memory_budget" in sup.log()


@pytest.mark.timeout(90)
def test_a_job_over_the_budget_is_snoozed_visible_and_runs_elsewhere(tmp_path, redis_url,
                                                                     queue):
    log, gate = tmp_path / "log", tmp_path / "gate"
    gate.touch()
    port = free_port()
    small = SupervisorProcess(config(tmp_path, redis_url, queue, "256MiB", name="small",
                                     metrics_port=port))
    with small.start() as sup:
        job = queue.enqueue_many([gated(queue, log, gate, "1GiB")])[0]
        enqueued = time.monotonic()
        until(lambda: "snoozed" in [h["event"] for h in queue.get(job.id).history],
              "the job is refused", sup)
        got = queue.get(job.id)
        assert got.state in ("scheduled", "pending", "active") and got.attempts == 0
        entry = next(h for h in got.history if h["event"] == "snoozed")
        assert "over the memory budget" in json.dumps(entry)
        until(lambda: [r["id"] for r in record(queue).get("memory_refused", [])] == [job.id],
              "the heartbeat lists the refusal", sup)
        out = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "stats", "-q", queue.name],
                             capture_output=True, text=True, cwd=REPO, timeout=30,
                             env={"FORQ_REDIS_URL": redis_url, "PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        assert job.id in out.stdout and "every live supervisor" in out.stdout, out.stdout
        out = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "supervisors"],
                             capture_output=True, text=True, cwd=REPO, timeout=30,
                             env={"FORQ_REDIS_URL": redis_url, "PATH": "/usr/bin:/bin"})
        assert "memory: small: 0 of 256 MiB budget in use" in out.stdout, out.stdout
        with WebProcess(redis_url) as web:  # and the dashboard's overview
            html = urllib.request.urlopen(f"{web.url}/", timeout=10).read().decode()
        assert job.id in html and "every live supervisor" in html
        assert "budget 0 of 256 MiB" in html
        # backed off, not hot: a growing delay between refusals (1 s, 2 s, 4 s, ...)
        waited = time.monotonic() - enqueued
        assert queue.get(job.id).snoozes <= 2 + math.log2(1 + waited), waited
        assert started(log) == []
        refused = memory_metrics(port, queue)["forq_memory_refused_total"]
        assert 1 <= refused <= queue.get(job.id).snoozes + 1, refused

        # a supervisor with room takes it; it runs once
        big = SupervisorProcess(config(tmp_path, redis_url, queue, "2GiB", name="big"))
        with big.start():
            done = wait_job(queue, job.id, ("succeeded", "dead"), timeout=30)
            assert done.state == "succeeded" and done.attempts == 1
            assert started(log) == [job.id]


def test_config_errors_are_clear(tmp_path):
    path = tmp_path / "forq.toml"
    write_config(path, "redis://127.0.0.1:6379/10", {"q": 1}, supervisor_extra='memory_budget = "lots"')
    with pytest.raises(ConfigError, match=r"memory_budget.*expected a size"):
        load_config(path)
    write_config(path, "redis://127.0.0.1:6379/10", {"q": 1}, memory_limit="512MiB",
                 supervisor_extra='memory_budget = "256MiB"')
    with pytest.raises(ConfigError, match=r'\[queue "q"\]: memory_limit \(512MiB\) is over '
                                          r"\[supervisor\].memory_budget \(256MiB\)"):
        load_config(path)
    write_config(path, "redis://127.0.0.1:6379/10", {"q": 1}, memory_limit="128MiB",
                 supervisor_extra='memory_budget = "256MiB"',
                 extra='[tasks."big"]\nmemory_limit = "1GiB"\n')
    with pytest.raises(ConfigError, match=r'\[tasks."big"\] on queue "q": memory_limit'):
        load_config(path)
    write_config(path, "redis://127.0.0.1:6379/10", {"q": 1}, memory_limit="128MiB",
                 supervisor_extra='memory_budget = "256MiB"')
    assert load_config(path, env={}).memory_budget == 256 * MiB


@pytest.mark.timeout(90)
def test_drain_gives_a_job_waiting_for_room_back_at_once(tmp_path, redis_url, queue):
    log, gate = tmp_path / "log", tmp_path / "gate"
    cfg = config(tmp_path, redis_url, queue, "1GiB")
    cfg.write_text(cfg.read_text().replace('drain_timeout = "5s"', 'drain_timeout = "30s"'))
    with SupervisorProcess(cfg).start() as sup:
        big1, big2 = (job.id for job in queue.enqueue_many(
            [gated(queue, log, gate, "600MiB"), gated(queue, log, gate, "600MiB")]))
        until(lambda: started(log) == [big1] and queue.get(big2).state == "active",
              "big1 runs, big2 waits leased", sup)
        sup.signal(signal.SIGTERM)
        # given back while big1 still runs: released, nothing counted
        until(lambda: queue.get(big2).state == "pending", "big2 released", sup)
        job = queue.get(big2)
        assert [h["event"] for h in job.history] == ["enqueued", "claimed", "released"]
        assert (job.attempts, job.crashes) == (0, 0) and queue.get(big1).state == "active"
        gate.touch()
        assert sup.wait(timeout=20) == 0
        assert queue.get(big1).state == "succeeded" and started(log) == [big1]


@pytest.mark.timeout(90)
def test_a_reload_that_lowers_the_budget_snoozes_held_jobs_over_it(tmp_path, redis_url, queue):
    log, gate = tmp_path / "log", tmp_path / "gate"
    cfg = config(tmp_path, redis_url, queue, "1GiB")
    with SupervisorProcess(cfg).start() as sup:
        big1, big2 = (job.id for job in queue.enqueue_many(
            [gated(queue, log, gate, "600MiB"), gated(queue, log, gate, "600MiB")]))
        until(lambda: started(log) == [big1] and queue.get(big2).state == "active",
              "big1 runs, big2 waits leased", sup)
        cfg.write_text(cfg.read_text().replace('memory_budget = "1GiB"',
                                               'memory_budget = "512MiB"'))
        sup.signal(signal.SIGHUP)
        # big2 could never fit now: snoozed at once, not held forever; big1 runs on
        until(lambda: "snoozed" in [h["event"] for h in queue.get(big2).history],
              "big2 snoozed", sup)
        assert queue.get(big2).attempts == 0 and queue.get(big1).state == "active"
        gate.touch()
        assert wait_job(queue, big1, ("succeeded", "dead")).state == "succeeded"
        assert started(log) == [big1]


def test_the_budget_arithmetic():
    """`MemoryBudget` alone (no processes): what counts, the reservation, the claim's ask."""
    from forq.supervisor.children.budget import MemoryBudget, refusal_delay

    b = MemoryBudget(1024 * MiB, reserve_after=2.0)
    assert b.admits("big1", "q", 600 * MiB, now=0.0)
    b.started("big1", 600 * MiB)
    assert not b.admits("big2", "q", 600 * MiB, now=0.0)  # 1200 > 1024: waits from t=0
    assert b.admits("s1", "q", 100 * MiB, now=1.0)  # small ones pass before 2 s...
    assert not b.admits("s2", "q", 100 * MiB, now=2.5)  # ...not after: 600+100+600 > 1024
    assert b.claimable("q", 0, now=1.0) == 4 and b.claimable("q", 0, now=2.5) == 0
    b.ended("big1")
    assert b.admits("big2", "q", 600 * MiB, now=3.0)  # the longest waiter first
    b.started("big2", 600 * MiB)
    assert b.used == 600 * MiB and b.waiting.keys() == {"s2"}
    b.started("free", 0)  # no limit: the whole budget
    assert b.used == 1624 * MiB and b.cost(0, "t") == 1024 * MiB
    b.ended("free")
    b.ended("big2")
    assert b.used == 0
    assert b.over(1025 * MiB) and not b.over(1024 * MiB)
    assert [refusal_delay(n) for n in (0, 1, 2, 6, 7, 50)] == [1000, 2000, 4000, 60000,
                                                               60000, 60000]
    # with no room for the smallest seen, one job is claimed while none of the queue waits
    c = MemoryBudget(1024 * MiB)
    c.admits("x", "q", 1000 * MiB, now=0.0)
    c.started("x", 1000 * MiB)
    assert c.claimable("q", 0, now=0.0) == 1
    assert not c.admits("y", "q", 100 * MiB, now=0.0)
    assert c.claimable("q", 0, now=0.0) == 0
    assert MemoryBudget(None).claimable("q", 0, now=0.0) is None
