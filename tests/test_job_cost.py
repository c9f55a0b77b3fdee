"""Each job's cost, measured and kept (issue 30, item 1), through a real `forq run`.

A handler burns a known CPU time (in its child, and in a grandchild it waits for) and
touches a known amount of memory; the figures its record keeps, `forq job` shows, the
metrics endpoint exports and `forq usage` totals are checked against them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from forq import Queue
from forq.fleet import redis_now
from forq.job import Job
from forq.supervisor.cli.usage.totals import read_usage
from forq.supervisor.leases.calls import leasing
from forq.units import format_size
from tests import helpers
from tests.helpers import wait_for
from tests.redis_server import free_port
from tests.supervisors import REPO, TEST_IMPORTS, SupervisorProcess, write_config
from tests.web_server import WebProcess

MIB = 1 << 20
IMPORTS = (*TEST_IMPORTS, "tests.cost_tasks")
TERMINAL = ("succeeded", "dead", "cancelled")


def supervisor(tmp_path: Path, redis_url: str, queue: Queue, metrics_port: int = 0,
               **options: Any) -> SupervisorProcess:
    options.setdefault("drain_timeout", "1s")
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2},
                          imports=IMPORTS, memory_limit="512MiB", **options)
    if metrics_port:
        config.write_text(config.read_text().replace(
            'listen = ""', f'listen = "127.0.0.1:{metrics_port}"'))
    return SupervisorProcess(config)


def scrape(port: int) -> dict[str, Any]:
    """The real /metrics endpoint, parsed: {sample name: [(labels, value), ...]}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def scraped_with(port: int, name: str, **labels: str) -> dict[str, Any] | None:
    """A scrape that has a sample `name` with `labels`, or None."""
    got = scrape(port)
    return got if sample(got, name, **labels) else None


def sample(samples: dict[str, Any], name: str, **labels: str) -> list[tuple[dict, float]]:
    return [(lb, v) for lb, v in samples.get(name, [])
            if all(lb.get(k) == want for k, want in labels.items())]


def wait_job(queue: Queue, job_id: str, sup: SupervisorProcess,
             states: tuple[str, ...] = TERMINAL) -> Job:
    return helpers.wait_job(queue, job_id, states, 60.0,
                            context=lambda: f"supervisor log:\n{sup.log()[-4000:]}")


def forq(redis_url: str, *args: str, json_out: bool = True) -> Any:
    proc = subprocess.run(
        [sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url, *args],
        capture_output=True, text=True, timeout=30, cwd=str(REPO),
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, f"forq {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout) if json_out else proc.stdout


def test_record_keeps_cpu_of_the_tree_peak_wall_and_start_latency(tmp_path, redis_url, queue):
    port = free_port()
    with supervisor(tmp_path, redis_url, queue, metrics_port=port) as sup:
        jid = queue.enqueue("cost.burn", 0.3, 100, 0.3).id
        job = wait_job(queue, jid, sup)
        assert job.state == "succeeded", job.history
        cost = job.cost
        assert cost is not None, job.fields
        cpu = (cost["cpu_user_ms"] + cost["cpu_system_ms"]) / 1000
        # 0.3 s here and 0.3 s in the grandchild; an interpreter's start-up on top
        assert 0.58 <= cpu <= 0.6 + 1.0, cost
        assert 100 * MIB <= cost["peak_memory"] <= 100 * MIB + 200 * MIB, cost
        wall = cost["wall_ms"] / 1000
        assert cpu * 0.9 <= wall <= 30, cost
        assert cost["start_latency_ms"] is not None
        assert 0 <= cost["start_latency_ms"] <= 10_000, cost

        # the histograms per task, from the supervisor's real endpoint
        mine = {"queue": queue.name, "task": "cost.burn"}
        # observed when the supervisor reads Redis's answer, just after the record changed
        samples = wait_for(lambda: scraped_with(port, "forq_job_cpu_seconds_count", **mine),
                           timeout=10, message="the attempt's cost in the histograms")
        assert sample(samples, "forq_job_cpu_seconds_count", **mine)[0][1] == 1
        assert sample(samples, "forq_job_cpu_seconds_sum", **mine)[0][1] == pytest.approx(
            cpu, abs=0.002)
        buckets = {lb["le"]: v for lb, v in sample(samples, "forq_job_cpu_seconds_bucket", **mine)}
        assert (buckets["0.5"], buckets["2.5"]) == (0, 1), buckets
        assert sample(samples, "forq_job_peak_memory_bytes_sum", **mine)[0][1] == cost[
            "peak_memory"]
        memory = {lb["le"]: v for lb, v in
                  sample(samples, "forq_job_peak_memory_bytes_bucket", **mine)}
        assert (memory[floatToGoString(64 * MIB)], memory[floatToGoString(512 * MIB)]) == (0, 1), memory
        assert sample(samples, "forq_job_start_latency_seconds_count", **mine)[0][1] == 1
        # no memory_budget: none of its metrics (`absent()` says so to an alert)
        assert not [name for name in samples if name.startswith("forq_memory_")]

        shown = forq(redis_url, "job", jid, "--json")
        assert shown["cost"] == cost
        text = forq(redis_url, "job", jid, json_out=False)
        line = next(ln for ln in text.splitlines() if ln.strip().startswith("cost"))
        assert f"cpu {cpu:.3f}s" in line, line
        assert f"peak memory {format_size(cost['peak_memory'])}" in line, line
        assert "start latency" in line, line

        with WebProcess(redis_url) as web:  # the dashboard's job page
            with urllib.request.urlopen(f"{web.url}/jobs/{queue.name}/{jid}", timeout=10) as r:
                html = r.read().decode()
        shown = html.split("<dt>cost</dt>", 1)[1].split("</dd>", 1)[0]
        assert f"cpu {cpu:.3f}s" in shown and "peak memory" in shown, shown
        assert f"start latency {cost['start_latency_ms']} ms" in shown, shown


def test_failed_and_crashed_runs_keep_their_cost_too(tmp_path, redis_url, queue):
    with supervisor(tmp_path, redis_url, queue, max_crashes=1) as sup:
        failed = queue.enqueue("cost.burn_then_fail", 0.2).id
        crashed = queue.enqueue("cost.burn_then_crash", 0.2).id
        for jid in (failed, crashed):
            job = wait_job(queue, jid, sup, ("dead",))
            cost = job.cost
            assert cost is not None, (jid, job.fields)
            assert 0.19 <= (cost["cpu_user_ms"] + cost["cpu_system_ms"]) / 1000 <= 1.5, cost
            assert cost["peak_memory"] > 0 and cost["wall_ms"] >= 190, cost


def test_usage_totals_per_group(tmp_path, redis_url, queue):
    with supervisor(tmp_path, redis_url, queue) as sup:
        jobs = [queue.enqueue("cost.burn", 0.1, 10, group="acme").id for _ in range(2)]
        jobs.append(queue.enqueue("cost.burn", 0.1, 10, group="zeta").id)
        jobs.append(queue.enqueue("cost.burn_then_fail", 0.1).id)  # no group, dead
        records = [wait_job(queue, jid, sup) for jid in jobs]
    costs = [job.cost for job in records]
    assert all(costs), [job.fields for job in records]

    every = {row["group"]: row for row in forq(redis_url, "usage", queue.name, "--json")["groups"]}
    assert {g: row["jobs"] for g, row in every.items()} == {"acme": 2, "zeta": 1, "": 1}
    for group, mine in (("acme", costs[:2]), ("zeta", costs[2:3]), ("", costs[3:])):
        row = every[group]
        assert row["cpu_seconds"] == pytest.approx(
            sum(c["cpu_user_ms"] + c["cpu_system_ms"] for c in mine) / 1000), group
        assert row["peak_memory_sum"] == sum(c["peak_memory"] for c in mine), group
        assert row["wall_seconds"] == pytest.approx(sum(c["wall_ms"] for c in mine) / 1000)
    assert every["acme"]["cpu_seconds"] >= 0.19

    one = forq(redis_url, "usage", queue.name, "--group", "zeta", "--since", "1h", "--json")
    assert [row["group"] for row in one["groups"]] == ["zeta"]
    text = forq(redis_url, "usage", queue.name, json_out=False)
    assert "acme" in text and "(no group)" in text, text
    # the totals expire: bounded without tuning
    hour_keys = list(queue.redis.scan_iter(match=f"forq:{{{queue.name}}}:usage:*"))
    assert hour_keys and all(0 < queue.redis.ttl(k) <= 8 * 24 * 3600 + 3600 for k in hour_keys)


def test_top_shows_running_jobs_cpu_memory_lease_and_progress(tmp_path, redis_url, queue):
    with supervisor(tmp_path, redis_url, queue) as sup:
        jid = queue.enqueue("cost.spin", 60, 64).id
        wait_job(queue, jid, sup, ("active",))

        def busy() -> dict[str, Any] | None:
            jobs = forq(redis_url, "top", "--once", "--json", "-q", queue.name)
            mine = next((j for j in jobs if j["id"] == jid), None)
            child = (mine or {}).get("child", {})
            # a second heartbeat gives CPU % over its interval; the progress comes with
            # the lease extension after the handler said it
            ready = (child.get("cpu_percent") or 0) > 20 and mine["progress"] == 0.5
            return mine if ready else None

        mine = wait_for(busy, timeout=30, message="the spinning job in forq top")
        child = mine["child"]
        assert child["rss_now"] >= 64 * MIB and child["rss"] >= child["rss_now"], child
        assert child["memory_limit"] == 512 * MIB and child["cpu"] > 0, child
        assert mine["lease_deadline_ms"] > 0 and mine["progress_message"] == "halfway"

        text = forq(redis_url, "top", "--once", json_out=False)
        row = next(line for line in text.splitlines() if line.startswith(jid))
        assert "cost.spin" in row and "/ 512.0MiB" in row and "50% halfway" in row, text
        assert text.splitlines()[0].split()[:6] == ["job", "queue", "task", "host", "elapsed",
                                                   "cpu%"], text
        with WebProcess(redis_url) as web:  # the dashboard's "running now" shows it too
            with urllib.request.urlopen(f"{web.url}/running", timeout=10) as resp:
                html = resp.read().decode()
        row = html.split(f'<tr data-job="{jid}">', 1)[1].split("</tr>", 1)[0]
        assert re.search(r'<td class="n">\d+% <span class="dim">[0-9.]+s</span></td>', row), row
        queue.cancel(jid)
        wait_job(queue, jid, sup)


def test_job_cost_false_keeps_nothing(tmp_path, redis_url, queue):
    with supervisor(tmp_path, redis_url, queue, supervisor_extra="job_cost = false") as sup:
        job = wait_job(queue, queue.enqueue("cost.burn", 0.01, 1).id, sup)
    assert job.state == "succeeded" and job.cost is None, job.fields
    assert not list(queue.redis.scan_iter(match=f"forq:{{{queue.name}}}:usage:*"))


def test_one_ack_call_adds_its_jobs_costs_per_group(queue):
    """A supervisor acks a loop turn's jobs in one call: their costs are summed per group
    and written once a group (lua/includes/cost.lua), and each record keeps its own."""
    ids = [queue.enqueue("cost.burn", 0, 0, group=g).id for g in ("a", "a", "b")]
    queue.set_limits(group_concurrency=3)
    calls = leasing(queue)
    leases = {lease.id: lease.token for lease in calls.claim("test:1", 3, 60_000).leases}
    assert set(leases) == set(ids)
    costs = ["100,10,1000,200,3", "300,30,3000,400,", "5,0,7,9,1"]
    answers = calls.ack_many([(jid, leases[jid], "null", [], cost)
                              for jid, cost in zip(ids, costs, strict=True)])
    assert answers == ["ok", "ok", "ok"]
    totals = read_usage(queue.redis, queue.name, 3600, redis_now(queue.redis))
    assert totals == {"a": {"jobs": 2, "cpu_ms": 440, "peak": 4000, "wall_ms": 600},
                      "b": {"jobs": 1, "cpu_ms": 5, "peak": 7, "wall_ms": 9}}
    assert queue.get(ids[1]).cost == {"cpu_user_ms": 300, "cpu_system_ms": 30,
                                      "peak_memory": 3000, "wall_ms": 400,
                                      "start_latency_ms": None}


def test_usage_adds_a_forq_before_it_whose_totals_had_a_field_per_figure(queue):
    """The totals are packed in one field a group (`runs:G`); the hour's hash of a
    supervisor of before kept a counter per figure (`jobs:G`, ...): `forq usage` adds both,
    and a packed field no script wrote is not counted."""
    now_s = redis_now(queue.redis)
    ukey = queue.keys.usage(int(now_s // 3600))
    queue.redis.hset(ukey, mapping={"jobs:a": 2, "cpu_ms:a": 40, "peak:a": 400, "wall_ms:a": 60,
                                    "runs:junk": "1,2,x,4"})
    jid = queue.enqueue("cost.burn", 0, 0, group="a").id
    calls = leasing(queue)
    (lease,) = calls.claim("test:1", 1, 60_000).leases
    assert calls.ack_many([(jid, lease.token, "null", [], "100,10,1000,200,3")]) == ["ok"]
    assert queue.redis.hget(ukey, "runs:a") == "1,110,1000,200"
    totals = read_usage(queue.redis, queue.name, 3600, redis_now(queue.redis))
    assert totals == {"a": {"jobs": 3, "cpu_ms": 150, "peak": 1400, "wall_ms": 260}}


# what a hostile child may say as its handler's first line ("began", CLOCK_MONOTONIC):
# not a number (None kept), or a number anywhere (clamped to the child's life)
HOSTILE_BEGAN = {
    "NaN": (b"NaN", None), "inf": (b"Infinity", None), "-inf": (b"-Infinity", None),
    "a string": (b'"soon"', None), "true": (b"true", None), "a list": (b"[1.5]", None),
    "an object": (b'{"t": 1}', None),
    "an int too large for a float": (b"1" + b"0" * 400, None),
    "a negative int too large": (b"-1" + b"0" * 400, None),
    "negative": (b"-5", "start"), "zero: before the claim": (b"0", "start"),
    "the largest float": (b"1.7976931348623157e308", "end"),
    "after its end": (b"1e12", "end"),
}


def test_a_hostile_began_is_never_a_start_latency_outside_the_childs_life(
        tmp_path, redis_url, queue):
    """The start latency's end is the one figure a child says: whatever it sends, the
    supervisor goes on, and the latency kept is none or within claim → the child's end
    (clamped: at the child's start when it says earlier, at its end when later)."""
    from tests.test_hostile import b64

    with supervisor(tmp_path, redis_url, queue) as sup:
        ids = {name: queue.enqueue("hostile.pipe", b64(
            b'{"began": ' + began + b', "t": "result", "ok": true, "result": 7}\n')).id
               for name, (began, _where) in HOSTILE_BEGAN.items()}
        for name, jid in ids.items():
            job = wait_job(queue, jid, sup)
            assert job.state == "succeeded" and job.result == 7, (name, job.history)
            cost, where = job.cost, HOSTILE_BEGAN[name][1]
            assert cost is not None, (name, job.fields)
            latency = cost["start_latency_ms"]
            if where is None:
                assert latency is None, (name, cost)
                continue
            at = {h["event"]: h["at"] for h in job.history}
            # the claim and the end by Redis's clock: the supervisor's claim was sent
            # before (a round trip), its child ended before the ack
            assert 0 <= latency <= at["succeeded"] - at["claimed"] + 100, (name, cost, at)
            if where == "end":
                assert latency >= cost["wall_ms"] - 1, (name, cost)
            else:
                assert latency <= 5000, (name, cost)  # the fork: far less than the 1e12 s
        assert sup.proc.poll() is None, sup.log()
        assert queue.enqueue("tests.echo", "still here").wait(timeout=20)["args"] == [
            "still here"]
        assert "Traceback" not in sup.log() and "unexpected error" not in sup.log(), sup.log()
