"""Each way a job can end, through a real `forq run` process: real fork, real signals.

Every test starts its own supervisor on a fresh queue (see tests/supervisors.py), enqueues
with the public API, and waits on conditions with deadlines (`wait_for`), never on a
bare sleep. What it checks is what a user would see: the job record and its history
(also through `forq job ID --json` and `forq stats --json`), and the processes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from forq import Queue
from forq.job import Job
from forq.supervisor.isolation.limits import KILL_GRACE
from tests import helpers
from tests.helpers import gone, wait_for
from tests.supervisors import REPO, SupervisorProcess, children_of, wait_children, write_config

TERMINAL = ("succeeded", "dead", "cancelled")


# -- helpers -------------------------------------------------------------------------------


def supervisor(tmp_path: Path, redis_url: str, queue: Queue, concurrency: int = 2,
               env: dict[str, str] | None = None, **options: Any) -> SupervisorProcess:
    """A supervisor serving only `queue` (options go to `write_config`)."""
    options.setdefault("drain_timeout", "1s")
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: concurrency},
                          **options)
    return SupervisorProcess(config, env=env)


def wait_job(queue: Queue, job_id: str, states: tuple[str, ...] = TERMINAL,
             timeout: float = 20.0, sup: SupervisorProcess | None = None) -> Job:
    """Wait until the job is in one of `states`; on timeout, say where it was."""
    return helpers.wait_job(
        queue, job_id, states, timeout,
        context=lambda: f"supervisor log:\n{sup.log()[-4000:]}" if sup is not None else "")


def events(job: Job) -> list[str]:
    return [entry["event"] for entry in job.history]


def entries(job: Job, event: str) -> list[dict[str, Any]]:
    return [entry for entry in job.history if entry["event"] == event]


def forq(redis_url: str, *args: str) -> Any:
    """Run the `forq` CLI as a user would and parse its JSON output."""
    proc = subprocess.run(
        [sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url, *args],
        capture_output=True, text=True, timeout=30, cwd=str(REPO),
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, f"forq {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout)


def job_processes(job_id: str) -> list[int]:
    """Live processes titled for this job (a child and any grandchild it forked)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if proc.info["status"] != psutil.STATUS_ZOMBIE and f"forq: job {job_id}" in cmdline:
            found.append(proc.pid)
    return found


def assert_clean_log(sup: SupervisorProcess) -> None:
    log = sup.log()
    assert "Traceback" not in log, log[-4000:]


# -- success -------------------------------------------------------------------------------


def test_success_stores_result_and_history_also_via_cli(tmp_path, redis_url, queue):
    with supervisor(tmp_path, redis_url, queue) as sup:
        before = time.time()
        jid = queue.enqueue("tests.echo", 1, "two", kwargs={"k": [3]}).id
        job = wait_job(queue, jid, sup=sup)

        assert job.state == "succeeded", job.history
        assert job.result == {"args": [1, "two"], "kwargs": {"k": [3]}}
        assert (job.attempts, job.crashes) == (1, 0)
        assert events(job) == ["enqueued", "claimed", "succeeded"]
        stamps = [entry["at"] for entry in job.history]
        assert stamps == sorted(stamps)
        # `at` is in seconds (Redis clock, same host as ours), not milliseconds
        assert all(before - 5 <= at <= time.time() + 5 for at in stamps), stamps
        assert entries(job, "claimed")[0]["owner"].endswith(f":{sup.pid}")

        shown = forq(redis_url, "job", jid, "--json")
        assert shown["id"] == jid
        assert shown["queue"] == queue.name
        assert shown["task"] == "tests.echo"
        assert shown["state"] == "succeeded"
        assert (shown["attempts"], shown["crashes"]) == (1, 0)
        assert shown["result"] == {"args": [1, "two"], "kwargs": {"k": [3]}}
        assert shown["error"] is None
        assert [e["event"] for e in shown["history"]] == ["enqueued", "claimed", "succeeded"]
        assert [e["at"] for e in shown["history"]] == stamps
        assert "memory_trail" not in job.fields  # a success leaves no death report

        one = forq(redis_url, "stats", "--json", "-q", queue.name)
        assert list(one) == [queue.name]
        counts = {k: one[queue.name][k]
                  for k in ("pending", "scheduled", "active", "dead", "succeeded")}
        assert counts == {"pending": 0, "scheduled": 0, "active": 0, "dead": 0, "succeeded": 1}
        every = forq(redis_url, "stats", "--json")
        assert every[queue.name]["succeeded"] == 1
    assert sup.proc.returncode == 0
    assert_clean_log(sup)


# -- handler errors and retries ------------------------------------------------------------


def test_handler_error_retries_with_backoff_then_dead(tmp_path, redis_url, queue):
    with supervisor(tmp_path, redis_url, queue, concurrency=3) as sup:
        failing = queue.enqueue("tests.fail", "kaput", max_attempts=3,
                                backoff={"base": "100ms", "factor": 2.0, "jitter": 0.0}).id
        flaky = queue.enqueue("examples.flaky").id
        fatal = queue.enqueue("tests.fatal", max_attempts=5).id

        job = wait_job(queue, failing, sup=sup)
        assert job.state == "dead"
        assert job.attempts == 3
        assert job.crashes == 0
        assert "kaput" in job.reason and "attempts exhausted: 3" in job.reason
        assert job.error["type"] == "ValueError"
        assert "ValueError: kaput" in job.error["traceback"]
        assert events(job) == ["enqueued", "claimed", "retry", "claimed", "retry", "claimed",
                               "dead"]
        retries = entries(job, "retry")
        assert [r["attempts"] for r in retries] == [1, 2]
        assert all("kaput" in r["reason"] for r in retries)
        # exponential backoff: run_at (ms) is 100 ms, then 200 ms after the failure
        gaps = [r["run_at"] - round(r["at"] * 1000) for r in retries]
        assert gaps == [100, 200], gaps
        # and no retry ran before its run_at
        claims = entries(job, "claimed")
        for retry, claim in zip(retries, claims[1:], strict=True):
            assert round(claim["at"] * 1000) >= retry["run_at"]

        job = wait_job(queue, flaky, sup=sup)
        assert job.state == "succeeded", job.history
        assert job.result == "succeeded on attempt 3"
        assert job.attempts == 3
        assert events(job).count("retry") == 2
        assert events(job).count("claimed") == 3

        job = wait_job(queue, fatal, sup=sup)
        assert job.state == "dead"
        assert job.attempts == 1  # NonRetryable: no retry although 5 were allowed
        assert "cannot ever work" in job.reason
        assert "attempts exhausted" not in job.reason
        assert events(job) == ["enqueued", "claimed", "dead"]

        stats = forq(redis_url, "stats", "--json", "-q", queue.name)[queue.name]
        assert (stats["dead"], stats["succeeded"], stats["pending"], stats["active"]) == \
            (2, 1, 0, 0)
    assert_clean_log(sup)


# -- time limit ------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_timeout_kills_child_retries_then_dead(tmp_path, redis_url, queue):
    with supervisor(tmp_path, redis_url, queue, concurrency=1) as sup:
        jid = queue.enqueue("examples.sleep", 30, timeout="500ms", max_attempts=2,
                            backoff={"base": "50ms", "jitter": 0.0}).id
        [pid] = wait_children(sup.pid, 1)
        seen = time.monotonic()
        # SIGTERM at 0.5 s (a sleeping handler dies of it), SIGKILL after the grace at worst
        wait_for(lambda: gone(pid), timeout=0.5 + KILL_GRACE + 2.0,
                 message=f"timed-out child {pid} to be gone")
        assert time.monotonic() - seen < 0.5 + KILL_GRACE + 2.0

        job = wait_job(queue, jid, timeout=15, sup=sup)
        assert job.state == "dead"
        assert job.attempts == 2
        assert job.crashes == 0
        assert job.reason.startswith("timeout"), job.reason
        assert job.reason.endswith("(attempts exhausted: 2)"), job.reason
        assert job.error["type"] == "Timeout"
        assert events(job) == ["enqueued", "claimed", "retry", "claimed", "dead"]
        [retry] = entries(job, "retry")
        assert retry["reason"].startswith("timeout"), retry
        # each attempt ended about when its time limit said, not after the 30 s sleep
        for claim, end in zip(entries(job, "claimed"), job.history[2::2], strict=True):
            assert 0.45 <= end["at"] - claim["at"] < 0.5 + KILL_GRACE + 1.0, job.history
        wait_for(lambda: not children_of(sup.pid), timeout=5, message="no children left")
    assert "time limit 0.5s reached" in sup.log()
    assert_clean_log(sup)


# -- memory limit ----------------------------------------------------------------------------

PEAK = re.compile(r"^memory limit exceeded \(peak ([0-9.]+) MiB, limit 64 MiB\)")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("in_grandchild", [False, True], ids=["child", "grandchild"])
def test_memory_limit_kills_and_fails(tmp_path, redis_url, queue, in_grandchild):
    with supervisor(tmp_path, redis_url, queue, concurrency=1) as sup:
        # 400 MiB in 4 MiB steps takes the handler a second or more: a sampler that a
        # loaded machine delays for a few ticks still kills it on the way
        jid = queue.enqueue("examples.hog", kwargs={"megabytes": 400, "step": 4,
                                                    "in_grandchild": in_grandchild},
                            memory_limit="64MiB", max_attempts=1).id
        job = wait_job(queue, jid, timeout=20, sup=sup)
        assert job.state == "dead", job.history
        assert job.attempts == 1 and job.crashes == 0
        match = PEAK.match(job.reason)
        assert match, (job.reason, sup.log()[-4000:])
        peak = float(match.group(1))
        # killed once over the limit, long before the 400 MiB the handler wanted (the
        # reason rounds to 0.1 MiB: RSS a few KiB over 64 MiB reads "64.0", likelier now
        # that a job's heap grows by 2 MiB huge pages, `fork/hugepages.py`)
        assert 64 <= peak < 400, job.reason
        assert job.error["type"] == "MemoryLimit"
        assert events(job) == ["enqueued", "claimed", "dead"]
        # its death report: the samples of its last seconds, oldest first, the one that
        # found it over the limit last
        trail = job.memory_trail
        assert 1 <= len(trail) <= 16, trail  # a loaded host may sample it only once
        befores = [before for before, _ in trail]
        assert befores == sorted(befores, reverse=True) and befores[0] <= 10, trail
        assert trail[-1][1] > 64 << 20 and trail[0][1] <= trail[-1][1], trail
        shown = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "--redis",
                                redis_url, "job", jid], cwd=REPO,
                               capture_output=True, text=True, timeout=30)
        assert "memory before its end" in shown.stdout, (shown.stdout, shown.stderr)
        assert forq(redis_url, "job", jid, "--json")["memory_trail"] == \
            [list(sample) for sample in trail]
        # the whole process group went: no grandchild outlives its job
        wait_for(lambda: not job_processes(jid), timeout=5,
                 message=f"every process of job {jid} to be gone")
    assert "over its limit 64 MiB, killing" in sup.log()
    assert_clean_log(sup)


def test_memory_limit_address_space_backstop_says_memory_limit(tmp_path, redis_url, queue):
    """One allocation far past the limit is refused by the child's RLIMIT_AS (4 x the
    limit) before any RSS sample sees it: the job still fails with the memory limit."""
    with supervisor(tmp_path, redis_url, queue, concurrency=1) as sup:
        jid = queue.enqueue("examples.hog", kwargs={"megabytes": 300, "step": 300},
                            memory_limit="64MiB", max_attempts=1).id
        job = wait_job(queue, jid, timeout=20, sup=sup)
        assert job.state == "dead", job.history
        assert job.reason.startswith("memory limit exceeded (peak "), job.reason
        assert "limit 64 MiB; address-space backstop" in job.reason
        assert job.error["type"] == "MemoryError"
        assert events(job) == ["enqueued", "claimed", "dead"]
    assert_clean_log(sup)


# -- crashes ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_segfault_and_exit_are_crashes_reclaimed_at_once(tmp_path, redis_url, queue):
    # a 30 s lease: a reclaim within a second or two can only be the parent's `expire`
    with supervisor(tmp_path, redis_url, queue, concurrency=2, lease_ttl="30s",
                    reaper_interval="5s") as sup:
        start = time.monotonic()
        seg = queue.enqueue("examples.segfault", max_crashes=3).id
        ex = queue.enqueue("examples.exit", 3, max_crashes=2).id

        job = wait_job(queue, seg, timeout=20, sup=sup)
        assert job.state == "dead", job.history
        assert job.crashes == 3
        assert job.attempts == 0  # a crash is not a failed attempt
        assert "killed by SIGSEGV" in job.reason and "crashes exhausted: 3" in job.reason
        assert events(job) == ["enqueued",
                               "claimed", "crashed", "reclaimed",
                               "claimed", "crashed", "reclaimed",
                               "claimed", "crashed", "dead"]
        for entry in entries(job, "crashed"):
            assert entry["reason"].startswith("killed by SIGSEGV (peak RSS ")
        assert [e["crashes"] for e in entries(job, "reclaimed")] == [1, 2]
        # each crash back in pending (or dead) well under the 30 s lease TTL
        claims = entries(job, "claimed")
        ends = [e for e in job.history if e["event"] in ("reclaimed", "dead")]
        for claim, end in zip(claims, ends, strict=True):
            assert end["at"] - claim["at"] < 3.0, job.history
        assert time.monotonic() - start < 15

        job = wait_job(queue, ex, timeout=20, sup=sup)
        assert job.state == "dead", job.history
        assert (job.crashes, job.attempts) == (2, 0)
        assert "exited with code 3 without a result" in job.reason
        assert "crashes exhausted: 2" in job.reason
        assert events(job) == ["enqueued", "claimed", "crashed", "reclaimed",
                               "claimed", "crashed", "dead"]

        shown = forq(redis_url, "job", seg, "--json")
        assert (shown["state"], shown["crashes"]) == ("dead", 3)
        assert "SIGSEGV" in shown["reason"]
        assert forq(redis_url, "stats", "--json", "-q", queue.name)[queue.name]["dead"] == 2
    assert_clean_log(sup)


@pytest.mark.timeout(60)
def test_child_sigkilled_from_outside_is_a_crash_and_runs_again(tmp_path, redis_url, queue):
    with supervisor(tmp_path, redis_url, queue, concurrency=1, lease_ttl="30s",
                    reaper_interval="5s") as sup:
        jid = queue.enqueue("examples.sleep", 20, max_crashes=3).id
        [first] = wait_children(sup.pid, 1)
        wait_job(queue, jid, ("active",), sup=sup)
        killed_at = time.time()
        os.kill(first, signal.SIGKILL)

        second = wait_for(lambda: [p for p in children_of(sup.pid) if p != first],
                          timeout=5, message="the job to run again in a new child")[0]
        assert second != first
        job = wait_job(queue, jid, ("active",), sup=sup)
        assert events(job) == ["enqueued", "claimed", "crashed", "reclaimed", "claimed"]
        assert job.crashes == 1
        [crash] = entries(job, "crashed")
        assert crash["reason"].startswith("killed by SIGKILL (peak RSS ")
        [reclaim] = entries(job, "reclaimed")
        assert reclaim["reason"] == crash["reason"]
        # back in pending within about a second of the kill, not after the 30 s lease
        assert reclaim["at"] - killed_at < 1.5, (killed_at, job.history)
        assert entries(job, "claimed")[1]["at"] - killed_at < 2.0
        assert not gone(second)
    assert_clean_log(sup)


# -- isolation -------------------------------------------------------------------------------


def _datagrams(sock: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096))
        except BlockingIOError:
            return out


def test_child_isolation_fds_title_session_nice_env(tmp_path, redis_url, queue):
    notify_path = str(tmp_path / "notify.sock")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.setblocking(False)
    received: list[bytes] = []
    try:
        with supervisor(tmp_path, redis_url, queue, env={"NOTIFY_SOCKET": notify_path}) as sup:
            wait_for(lambda: received.extend(_datagrams(notify))
                     or any(b"READY=1" in d.split(b"\n") for d in received),
                     timeout=5, message="READY=1 on the notify socket")
            jid = queue.enqueue("tests.open_fds").id
            job = wait_job(queue, jid, sup=sup)
    finally:
        notify.close()
    assert job.state == "succeeded", job.history
    info = job.result
    # stdio and the result pipe (fd 3); a fifth fd can only be the directory the
    # handler's own os.listdir("/proc/self/fd") had open while listing
    assert info["fds"][:4] == [0, 1, 2, 3], info
    assert info["fds"] in ([0, 1, 2, 3], [0, 1, 2, 3, 4]), info
    # no socket but its channel to the parent (fd 3, a socketpair for step answers):
    # neither the supervisor's Redis connections nor the notify socket
    assert info["sockets"] == [3], info
    assert info["title"].rstrip("\x00 ").startswith(f"forq: job {jid} tests.open_fds"), info
    assert info["sid"] == info["pid"] == info["pgid"], info  # own session and process group
    assert info["pid"] != sup.pid
    assert info["nice"] >= 10, info
    assert info["env_notify"] is None, info  # NOTIFY_SOCKET is the supervisor's, not the job's
    assert any(b"READY=1" in d.split(b"\n") for d in received), received


# -- the supervisor dies ---------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_child_dies_with_a_sigkilled_supervisor(tmp_path, redis_url, queue):
    with supervisor(tmp_path, redis_url, queue, concurrency=1) as sup:
        jid = queue.enqueue("examples.sleep", 30).id
        [child] = wait_children(sup.pid, 1)
        wait_job(queue, jid, ("active",), sup=sup)
        assert not gone(child)
        sup.kill()  # SIGKILL: no drain, no chance to stop its children itself
        wait_for(lambda: gone(child), timeout=5,
                 message=f"child {child} to die with its supervisor (PR_SET_PDEATHSIG)")
        assert not job_processes(jid)
        # nobody reported anything: the lease is still held until it expires
        assert queue.get(jid).state == "active"


# -- bad input -------------------------------------------------------------------------------


def test_unknown_task_and_oversized_result_go_dead_at_once(tmp_path, redis_url, queue):
    with supervisor(tmp_path, redis_url, queue) as sup:
        unknown = queue.enqueue("tests.no_such_task", max_attempts=5).id
        big = queue.enqueue("tests.big_result", 10_000, max_result_bytes="1KiB",
                            max_attempts=5).id
        small = queue.enqueue("tests.big_result", 100, max_result_bytes="1KiB").id

        job = wait_job(queue, unknown, sup=sup)
        assert job.state == "dead"
        assert job.reason == "unknown task 'tests.no_such_task'"
        assert job.attempts == 1 and job.crashes == 0
        assert events(job) == ["enqueued", "claimed", "dead"]

        job = wait_job(queue, big, sup=sup)
        assert job.state == "dead"
        assert job.reason.startswith("result too large"), job.reason
        assert "1024" in job.reason
        assert job.attempts == 1  # not retried although 5 attempts were allowed
        assert events(job) == ["enqueued", "claimed", "dead"]
        assert job.result is None

        job = wait_job(queue, small, sup=sup)
        assert job.state == "succeeded"
        assert job.result == "x" * 100
    assert "unknown task 'tests.no_such_task'" in sup.log()
    assert_clean_log(sup)


# -- every core saturated --------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_saturated_cores_lose_no_lease(tmp_path, redis_url, queue):
    burn = 8.0
    cores = os.cpu_count() or 2
    jobs = max(4, cores * 2)
    with supervisor(tmp_path, redis_url, queue, concurrency=jobs, lease_ttl="1s",
                    reaper_interval="200ms") as sup:
        start = time.monotonic()
        ids = [j.id for j in queue.enqueue_many(
            {"task": "examples.burn", "args": [burn], "timeout": "30s"} for _ in range(jobs))]
        wait_children(sup.pid, jobs, timeout=10)
        done = [wait_job(queue, jid, timeout=burn + 20, sup=sup) for jid in ids]
        elapsed = time.monotonic() - start
    log = sup.log()
    for job in done:
        assert job.state == "succeeded", (job.history, log[-4000:])
        assert isinstance(job.result, int) and job.result > 0
        # executed exactly once: one claim, no crash, no reclaim, no lost lease
        assert events(job) == ["enqueued", "claimed", "succeeded"], (job.history, log[-4000:])
        assert (job.attempts, job.crashes) == (1, 0)
        # ran the whole burn on one lease that lived 8 times its 1 s TTL
        assert entries(job, "succeeded")[0]["at"] - entries(job, "claimed")[0]["at"] >= burn
    assert "lease lost" not in log, log[-4000:]
    assert "not confirmed in time" not in log, log[-4000:]
    assert "reclaimed" not in log, log[-4000:]
    assert elapsed < burn + 7, elapsed
