"""Real supervisors, real signals: SIGKILL with a peer reclaiming, SIGTERM/SIGINT drains
(finishing, timing out, a second signal), a lease lost while SIGSTOPped, Redis restarted
under a running supervisor, SIGHUP reloads good and bad, config errors, idle CPU and
pick-up latency.

Every supervisor runs as its own `forq run --config` process. Nothing waits on a bare
sleep: each step waits (with a deadline) for the effect it needs, read from Redis, from
the supervisor's log, from the process table, or from the file `tests.touch` appends
to at every execution's start and end (outside Redis, so it also shows runs Redis
never heard about).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from forq import Queue
from forq.store.connection import connect
from tests.helpers import gone, wait_for
from tests.redis_server import RedisServer
from tests.supervisors import REPO, SupervisorProcess, children_of, write_config

HOST = socket.gethostname()

# the short timings every test uses: the file runs in well under a minute or two
LEASE_TTL = 1.0
REAPER = 0.2


# -- helpers ---------------------------------------------------------------------------


def sup_id(sup: SupervisorProcess) -> str:
    """The id a supervisor puts in leases and history: host:pid."""
    return f"{HOST}:{sup.pid}"


def redis_now(r) -> float:
    """Redis TIME in seconds (the clock of every timestamp in a job's history)."""
    sec, usec = r.time()
    return int(sec) + int(usec) / 1e6


def runs(path: Path) -> list[tuple[str, int, str]]:
    """(job id, pid, "start"|"end") for every line tests.touch wrote."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        job_id, pid, event = line.split()
        out.append((job_id, int(pid), event))
    return out


def started_pids(path: Path, job_id: str) -> list[int]:
    return [pid for j, pid, ev in runs(path) if j == job_id and ev == "start"]


def ended_pids(path: Path, job_id: str) -> list[int]:
    return [pid for j, pid, ev in runs(path) if j == job_id and ev == "end"]


def events(job) -> list[str]:
    return [h["event"] for h in job.history]


def forq(redis_url: str, *args: str) -> subprocess.CompletedProcess:
    """The `forq` command line, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url, *args],
        capture_output=True, text=True, cwd=str(REPO), timeout=30,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )


def forq_job(redis_url: str, job_id: str) -> dict:
    out = forq(redis_url, "job", job_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def watch_alive(sup: SupervisorProcess, seconds: float) -> None:
    """Hold for `seconds` while checking, every few ms, that the supervisor lives:
    the stimulus (an idle period, an outage) lasts that long; nothing waits on it."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert sup.proc.poll() is None, f"supervisor exited:\n{sup.log()}"
        time.sleep(0.05)


def log_has(sup: SupervisorProcess, pattern: str) -> bool:
    return re.search(pattern, sup.log()) is not None


def wait_log(sup: SupervisorProcess, pattern: str, timeout: float = 10.0) -> None:
    try:
        wait_for(lambda: log_has(sup, pattern), timeout=timeout, message=repr(pattern))
    except AssertionError as exc:
        raise AssertionError(f"{exc}; log:\n{sup.log()}") from None


def wait_state(queue: Queue, job_id: str, state: str, timeout: float = 10.0):
    try:
        return wait_for(lambda: (j := queue.get(job_id)).state == state and j,
                        timeout=timeout, message=f"job {job_id} {state}")
    except AssertionError as exc:
        job = queue.get(job_id)
        raise AssertionError(f"{exc}; it is {job.state}: {job.history}") from None


def wait_exit(sup: SupervisorProcess, timeout: float) -> int:
    try:
        return sup.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"supervisor still running after {timeout}s:\n{sup.log()}") from None


def drop_queue(r, name: str) -> None:
    keys = list(r.scan_iter(match=f"forq:{{{name}}}:*", count=1000))
    for start in range(0, len(keys), 500):
        r.delete(*keys[start:start + 500])
    r.srem("forq:queues", name)


def _dispose(sup: SupervisorProcess) -> None:
    """Stop a test's supervisor for good: wake it if stopped, kill it and whatever
    it forked (each child leads its own process group), print its log for a failure."""
    proc = sup.proc
    if proc is None:
        return
    if proc.poll() is None:
        try:
            descendants = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        try:
            os.kill(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        proc.kill()
        proc.wait(timeout=10)
        for child in descendants:
            for kill in (lambda c=child: os.killpg(c.pid, signal.SIGKILL),
                         lambda c=child: os.kill(c.pid, signal.SIGKILL)):
                try:
                    kill()
                except (ProcessLookupError, PermissionError):
                    pass
    sup.close_log()
    print(f"--- supervisor {proc.pid} (exit {proc.returncode}) log:\n{sup.log()}")
    sup.log_path.unlink(missing_ok=True)


# -- fixtures --------------------------------------------------------------------------


@pytest.fixture
def supervisors() -> Iterator[Callable[..., list[SupervisorProcess]]]:
    """start(config, n=1) → n ready supervisors on `config`, started side by side;
    every one is killed (with its children) at teardown, whatever the test did."""
    started: list[SupervisorProcess] = []

    def start(config: Path, n: int = 1) -> list[SupervisorProcess]:
        batch = [SupervisorProcess(config) for _ in range(n)]
        for sup in batch:
            started.append(sup)
            sup.start(wait_ready=False)
        for sup in batch:
            wait_for(lambda s=sup: "ready" in s.log() or s.proc.poll() is not None,
                     timeout=30, message="supervisor ready")
            assert sup.proc.poll() is None, f"supervisor exited:\n{sup.log()}"
        return batch

    yield start
    for sup in started:
        _dispose(sup)


@pytest.fixture
def other_queue(r) -> Iterator[Queue]:
    name = "t" + uuid.uuid4().hex[:12]
    yield Queue(name, redis=r)
    drop_queue(r, name)


@pytest.fixture
def private_redis() -> Iterator[list[RedisServer]]:
    """A private append-only Redis (a list: a restart replaces it); stopped at teardown."""
    server = RedisServer(appendonly=True, appendfsync="always").start()
    servers = [server]
    yield servers
    for s in servers:
        s.stop(sig="kill")
    shutil.rmtree(server.dir, ignore_errors=True)


def config(tmp_path: Path, redis_url: str, queues: dict[str, int], **kw) -> Path:
    kw.setdefault("lease_ttl", f"{LEASE_TTL:g}s")
    kw.setdefault("reaper_interval", f"{int(REAPER * 1000)}ms")
    return write_config(tmp_path / f"forq-{uuid.uuid4().hex[:6]}.toml", redis_url, queues, **kw)


def start_touch(queue: Queue, path: Path, sleep: float) -> tuple[str, int]:
    """Enqueue a tests.touch job and wait until its handler runs: (job id, child pid)."""
    job = queue.enqueue("tests.touch", str(path), sleep)
    pids = wait_for(lambda: started_pids(path, job.id), timeout=10,
                    message=f"job {job.id} started")
    return job.id, pids[0]


# -- SIGKILL: a peer reclaims --------------------------------------------------------------


@pytest.mark.timeout(90)
def test_sigkilled_supervisor_job_reclaimed_by_peer(tmp_path, redis_url, r, queue, supervisors):
    cfg = config(tmp_path, redis_url, {queue.name: 1})
    a, b = supervisors(cfg, n=2)
    by_id = {sup_id(a): a, sup_id(b): b}
    touch = tmp_path / "touch"
    job_id, child = start_touch(queue, touch, 2.0)

    owner = queue.get(job_id).fields["owner"]
    victim = by_id[owner]
    peer = b if victim is a else a
    assert child in children_of(victim.pid)

    killed_at = redis_now(r)
    victim.kill()  # SIGKILL
    assert victim.proc.returncode == -signal.SIGKILL

    # PR_SET_PDEATHSIG: the child dies with its supervisor, it does not finish the job
    # (well before its 2 s sleep would have ended it anyway)
    wait_for(lambda: gone(child), timeout=1.5, message=f"child {child} killed with its parent")

    job = wait_state(queue, job_id, "succeeded", timeout=LEASE_TTL + REAPER + 2.0 + 10)
    reclaimed = [h for h in job.history if h["event"] == "reclaimed"]
    assert len(reclaimed) == 1, job.history
    assert reclaimed[0]["by"] == sup_id(peer)
    assert reclaimed[0]["owner"] == sup_id(victim)
    assert "lease expired" in reclaimed[0]["reason"]
    took = reclaimed[0]["at"] - killed_at
    assert 0 < took <= LEASE_TTL + REAPER + 0.8, f"reclaimed {took:.2f}s after the kill"

    claims = [h["owner"] for h in job.history if h["event"] == "claimed"]
    assert claims == [sup_id(victim), sup_id(peer)]
    assert events(job).count("succeeded") == 1
    assert job.crashes == 1
    assert job.attempts == 1

    # the victim's execution started and never ended; the peer's ran to the end
    rerun = [p for p in started_pids(touch, job_id) if p != child]
    assert started_pids(touch, job_id) == [child, *rerun] and len(rerun) == 1
    assert ended_pids(touch, job_id) == rerun
    assert job.result == rerun[0]
    assert log_has(peer, r"reclaimed 1 expired lease")

    # what a user sees
    shown = forq_job(redis_url, job_id)
    assert shown["state"] == "succeeded" and shown["crashes"] == 1
    assert [h["event"] for h in shown["history"]] == [
        "enqueued", "claimed", "reclaimed", "claimed", "succeeded"]


# -- SIGTERM / SIGINT: drain ---------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.timeout(90)
def test_a_drain_whose_last_job_lost_its_lease_ends_at_once(tmp_path, redis_url, r, queue,
                                                            supervisors):
    """The last child of a drain is fenced (its lease taken elsewhere): its report has
    nothing to send (the result is dropped), and the supervisor exits then, not at the
    end of its drain timeout plus the reports' grace. No memory sample is taken (an hour
    apart), so the report carries no memory trail to send either."""
    cfg = config(tmp_path, redis_url, {queue.name: 1}, drain_timeout="30s",
                 memory_sample_interval="1h")
    (sup,) = supervisors(cfg)
    touch = tmp_path / "touch"
    job_id, child = start_touch(queue, touch, 60)
    sup.signal(signal.SIGTERM)
    wait_log(sup, r"SIGTERM: draining 1 running job")
    sent = time.monotonic()
    r.hset(f"forq:{{{queue.name}}}:job:{job_id}", "token", "taken-elsewhere")
    wait_log(sup, r"lease lost, killing its child", timeout=15)
    assert wait_exit(sup, timeout=15) == 0
    assert time.monotonic() - sent < 15  # not 30 s of drain, nor 15 more of grace
    assert gone(child)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_drain_lets_running_job_finish_and_claims_nothing(tmp_path, redis_url, r, queue,
                                                          supervisors, sig):
    # two slots: one stays free during the drain, so a claim would have room
    cfg = config(tmp_path, redis_url, {queue.name: 2}, drain_timeout="20s")
    (sup,) = supervisors(cfg)
    touch = tmp_path / "touch"
    job_id, child = start_touch(queue, touch, 1.5)

    signalled_at = redis_now(r)
    sent = time.monotonic()
    sup.signal(sig)
    wait_log(sup, rf"{sig.name}: draining 1 running job")
    later = [queue.enqueue("tests.touch", str(touch), 0).id for _ in range(3)]

    assert wait_exit(sup, timeout=15) == 0
    elapsed = time.monotonic() - sent
    # it left once the job was done, not at the end of its 20 s drain_timeout
    assert elapsed < 8, f"drain took {elapsed:.1f}s"

    job = queue.get(job_id)
    assert job.state == "succeeded", job.history
    assert job.attempts == 1 and job.crashes == 0
    assert job.result == child
    done = [h for h in job.history if h["event"] == "succeeded"]
    assert len(done) == 1 and done[0]["at"] >= signalled_at  # acked during the drain
    assert ended_pids(touch, job_id) == [child]
    assert "released" not in events(job)

    # nothing claimed after the signal: the jobs enqueued during the drain wait
    for jid in later:
        j = queue.get(jid)
        assert j.state == "pending" and events(j) == ["enqueued"], j.history
        assert started_pids(touch, jid) == []
    stats = queue.stats()
    assert stats["pending"] == 3 and stats["active"] == 0
    assert log_has(sup, r"stopped")
    assert gone(child)


@pytest.mark.timeout(90)
def test_drain_timeout_stops_child_and_releases_lease(tmp_path, redis_url, r, queue,
                                                      supervisors):
    cfg = config(tmp_path, redis_url, {queue.name: 1}, drain_timeout="1s")
    (sup,) = supervisors(cfg)
    touch = tmp_path / "touch"
    job_id, child = start_touch(queue, touch, 30)

    sent = time.monotonic()
    sup.signal(signal.SIGTERM)
    assert wait_exit(sup, timeout=15) == 0
    elapsed = time.monotonic() - sent
    assert 0.9 <= elapsed < 1.0 + 2.0 + 3.0, f"exited {elapsed:.2f}s after SIGTERM"
    assert gone(child)

    job = queue.get(job_id)
    assert job.state == "pending", job.history
    assert job.attempts == 0 and job.crashes == 0
    assert events(job) == ["enqueued", "claimed", "released"]
    assert job.history[-1]["reason"] == "drain timeout"
    assert job.history[-1]["owner"] == sup_id(sup)
    assert "owner" not in job.fields and "token" not in job.fields
    stats = queue.stats()
    assert stats["pending"] == 1 and stats["active"] == 0
    # the handler was stopped, not allowed to run on
    assert started_pids(touch, job_id) == [child]
    assert ended_pids(touch, job_id) == []
    assert log_has(sup, r"released \(drain timeout\)")

    shown = forq_job(redis_url, job_id)
    assert shown["state"] == "pending" and shown["attempts"] == 0 and shown["crashes"] == 0
    assert shown["history"][-1]["event"] == "released"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("first,second", [(signal.SIGTERM, signal.SIGTERM),
                                          (signal.SIGINT, signal.SIGINT)],
                         ids=["SIGTERM-SIGTERM", "SIGINT-SIGINT"])
def test_second_signal_stops_at_once_and_still_releases(tmp_path, redis_url, r, queue,
                                                        supervisors, first, second):
    cfg = config(tmp_path, redis_url, {queue.name: 2}, drain_timeout="30s")
    (sup,) = supervisors(cfg)
    touch = tmp_path / "touch"
    a_id, a_child = start_touch(queue, touch, 30)
    b_id, b_child = start_touch(queue, touch, 30)

    sent = time.monotonic()
    sup.signal(first)
    wait_log(sup, rf"{first.name}: draining 2 running job")
    sup.signal(second)
    assert wait_exit(sup, timeout=15) == 0
    elapsed = time.monotonic() - sent
    assert elapsed < 5, f"exited {elapsed:.1f}s after the first signal (drain_timeout 30s)"
    assert log_has(sup, rf"{second.name} again: stopping 2 job")

    for job_id, child in ((a_id, a_child), (b_id, b_child)):
        assert gone(child)
        job = queue.get(job_id)
        assert job.state == "pending", job.history
        assert job.attempts == 0 and job.crashes == 0
        assert events(job)[-1] == "released"
        assert job.history[-1]["reason"] == "second signal"
        assert ended_pids(touch, job_id) == []
    assert queue.stats()["pending"] == 2


# -- fencing: a lease lost while the supervisor was stopped ------------------------------------


@pytest.mark.timeout(90)
def test_lease_lost_while_stopped_child_killed_and_not_acked(tmp_path, redis_url, r, queue,
                                                             supervisors):
    cfg = config(tmp_path, redis_url, {queue.name: 1})
    a, b = supervisors(cfg, n=2)
    by_id = {sup_id(a): a, sup_id(b): b}
    touch = tmp_path / "touch"
    sleep = 3.0
    job_id, child = start_touch(queue, touch, sleep)
    child_started = time.monotonic()
    victim = by_id[queue.get(job_id).fields["owner"]]
    peer = b if victim is a else a
    assert child in children_of(victim.pid)

    victim.signal(signal.SIGSTOP)
    try:
        # past its TTL the peer's reaper reclaims the lease, and the peer runs the job
        wait_for(lambda: len(started_pids(touch, job_id)) == 2, timeout=LEASE_TTL + 5,
                 message="the peer runs the job")
        job = queue.get(job_id)
        assert [h["owner"] for h in job.history if h["event"] == "claimed"] == [
            sup_id(victim), sup_id(peer)]
        assert [h["by"] for h in job.history if h["event"] == "reclaimed"] == [sup_id(peer)]
    finally:
        victim.signal(signal.SIGCONT)
        resumed = time.monotonic()

    # the stopped supervisor, resumed, must not let its child report: it kills it
    # (lease not proven) or, had the child already finished, its ack is refused
    wait_for(lambda: gone(child), timeout=5, message="the fenced child is gone")
    wait_log(victim, r"lease not confirmed in time, killing its child|lease lost|answered lost")
    if resumed - child_started < sleep - 0.5:
        # resumed while its child still slept: the child must be killed, not finish
        assert child not in ended_pids(touch, job_id), victim.log()
    elif child in ended_pids(touch, job_id):
        assert log_has(victim, r"answered lost"), victim.log()

    job = wait_state(queue, job_id, "succeeded", timeout=15)
    rerun = [p for p in started_pids(touch, job_id) if p != child]
    assert len(rerun) == 1
    assert job.result == rerun[0]  # the peer's completion, not the fenced one
    assert events(job).count("succeeded") == 1
    assert job.attempts == 1 and job.crashes == 1
    assert rerun[0] in ended_pids(touch, job_id)
    assert victim.proc.poll() is None, "the resumed supervisor must keep running"
    assert not log_has(victim, rf"job {job_id} tests.touch succeeded")

    stats = json.loads(forq(redis_url, "stats", "-q", queue.name, "--json").stdout)[queue.name]
    assert stats["succeeded"] == 1
    assert stats["active"] == 0 and stats["pending"] == 0
    # both supervisors still drain cleanly
    for sup in (a, b):
        sup.signal(signal.SIGTERM)
    assert wait_exit(victim, 15) == 0 and wait_exit(peer, 15) == 0


@pytest.mark.timeout(90)
def test_a_frozen_supervisors_child_dies_before_its_job_runs_elsewhere(tmp_path, redis_url, r,
                                                                       queue, supervisors):
    """SIGSTOP freezes the supervisor, not its fork server: the fork server kills the
    child once the lease it holds is no longer proven, while the supervisor is still
    stopped, so the peer's re-run never overlaps it."""
    cfg = config(tmp_path, redis_url, {queue.name: 1})
    (victim,) = supervisors(cfg)
    touch = tmp_path / "touch"
    job_id, child = start_touch(queue, touch, 4.0)
    victim.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(lambda: gone(child), timeout=LEASE_TTL + 2,
                 message="the frozen supervisor's child killed by its fork server")
        # at the latest a lease_ttl after the last extension, which came before the stop
        assert time.monotonic() - stopped < LEASE_TTL + 0.3
        assert psutil.Process(victim.pid).status() == psutil.STATUS_STOPPED
        assert child not in ended_pids(touch, job_id)
        (peer,) = supervisors(cfg)
        job = wait_state(queue, job_id, "succeeded", timeout=20)
    finally:
        victim.signal(signal.SIGCONT)
    rerun = [p for p in started_pids(touch, job_id) if p != child]
    assert job.result == rerun[0] and job.crashes == 1, job.history
    wait_log(victim, r"lease not confirmed in time|lease lost")  # said once it thaws
    assert victim.proc.poll() is None
    for sup in (victim, peer):
        sup.signal(signal.SIGTERM)
    assert wait_exit(victim, 15) == 0 and wait_exit(peer, 15) == 0
    assert "Traceback" not in victim.log()


# -- Redis restarted under a running supervisor -----------------------------------------------


@pytest.mark.timeout(90)
def test_redis_restart_under_running_supervisor(tmp_path, private_redis, supervisors):
    server = private_redis[0]
    client = connect(server.url)
    queue = Queue("restart", redis=client)
    # a lease long enough to outlive the outage: the running job must not be fenced
    cfg = config(tmp_path, server.url, {queue.name: 2}, lease_ttl="6s")
    (sup,) = supervisors(cfg)
    touch = tmp_path / "touch"
    before = [queue.enqueue("examples.add", i, 1) for i in range(5)]
    for i, job in enumerate(before):
        assert job.wait(timeout=10) == i + 1

    # a job that finishes while Redis is down: its report waits and is sent later
    job_id, child = start_touch(queue, touch, 0.3)
    cpu_before = cpu_seconds(sup.pid)
    down = time.monotonic()
    server.stop()  # SIGTERM
    wait_for(lambda: ended_pids(touch, job_id), timeout=10, message="the job ends in the outage")
    wait_log(sup, r"redis \w+ failed", timeout=10)
    watch_alive(sup, max(0.0, 1.5 - (time.monotonic() - down)))
    outage = time.monotonic() - down
    cpu_used = cpu_seconds(sup.pid) - cpu_before
    assert cpu_used < 0.3, f"supervisor used {cpu_used:.2f}s CPU in a {outage:.1f}s outage"

    server = RedisServer(server.port, appendonly=True, appendfsync="always",
                         workdir=server.dir).start()
    private_redis.append(server)
    # a fresh script cache (a script the supervisor never calls, so no race)
    assert client.script_exists(queue.scripts.purge_dead.sha) == [False]

    # the report sent after the restart lands; state from before the outage survived
    job = wait_state(queue, job_id, "succeeded", timeout=15)
    assert job.attempts == 1 and job.crashes == 0
    assert job.result == child
    assert all(queue.get(j.id).state == "succeeded" for j in before)

    after = [queue.enqueue("examples.add", i, 2) for i in range(5)]
    for i, job in enumerate(after):
        assert job.wait(timeout=15) == i + 2
    # the supervisor's own scripts were loaded again (NOSCRIPT → SCRIPT LOAD)
    assert client.script_exists(queue.scripts.claim.sha) == [True]
    assert sup.proc.poll() is None
    assert log_has(sup, r"redis reachable again")
    sup.signal(signal.SIGTERM)
    assert wait_exit(sup, 15) == 0


# -- SIGHUP reload -------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_sighup_reload_good_then_bad(tmp_path, redis_url, r, queue, other_queue, supervisors):
    path = tmp_path / "forq.toml"
    write_config(path, redis_url, {queue.name: 1}, lease_ttl="1s", reaper_interval="200ms")
    (sup,) = supervisors(path)
    touch = tmp_path / "touch"
    waiting = other_queue.enqueue("tests.echo", "new queue")
    running_id, running_child = start_touch(queue, touch, 1.0)
    assert other_queue.get(waiting.id).state == "pending"  # not served yet

    # good file: a second slot and a new queue, while a job runs
    write_config(path, redis_url, {queue.name: 2, other_queue.name: 1}, lease_ttl="1s",
                 reaper_interval="200ms")
    sup.signal(signal.SIGHUP)
    wait_log(sup, rf"reloaded {re.escape(str(path))}")
    assert waiting.wait(timeout=10) == {"args": ["new queue"], "kwargs": {}}

    job = wait_state(queue, running_id, "succeeded", timeout=10)
    assert job.attempts == 1 and job.crashes == 0 and "released" not in events(job)
    assert job.result == running_child

    # concurrency 2: two jobs run side by side
    pair = [queue.enqueue("tests.touch", str(touch), 0.8).id for _ in range(2)]
    for jid in pair:
        wait_state(queue, jid, "succeeded", timeout=10)
    order = [(j, ev) for j, _pid, ev in runs(touch) if j in pair]
    assert [ev for _j, ev in order] == ["start", "start", "end", "end"], order

    # bad file: refused with a log line, the running config stays
    path.write_text("[supervisor\nlease_ttl = ")
    sup.signal(signal.SIGHUP)
    wait_log(sup, r"reload refused")
    line = next(ln for ln in sup.log().splitlines() if "reload refused" in ln)
    assert str(path) in line
    assert sup.proc.poll() is None
    assert queue.enqueue("tests.echo", 1).wait(timeout=10) == {"args": [1], "kwargs": {}}
    assert other_queue.enqueue("tests.echo", 2).wait(timeout=10) == {"args": [2], "kwargs": {}}
    sup.signal(signal.SIGTERM)
    assert wait_exit(sup, 15) == 0


# -- config errors -------------------------------------------------------------------------

GOOD = """
[redis]
url = "redis://127.0.0.1:1/0"

[supervisor]
lease_ttl = "1s"

[[queue]]
name = "q"
concurrency = 1
"""

BAD_CONFIGS = {
    "missing file": (None, None),
    "unknown key": (GOOD.replace('lease_ttl = "1s"', 'lease_tll = "1s"'), "lease_tll"),
    "bad duration": (GOOD.replace('"1s"', '"fast"'), "lease_ttl"),
}


@pytest.mark.parametrize("command", [["run", "--config"], ["config", "check"]],
                         ids=["run", "config-check"])
@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_config_error_exit_2_one_line(tmp_path, command, case):
    text, key = BAD_CONFIGS[case]
    path = tmp_path / "forq.toml"
    if text is not None:
        path.write_text(text)
    out = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", *command, str(path)],
                         capture_output=True, text=True, cwd=str(REPO), timeout=30,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert str(path) in lines[0]
    if key is not None:
        assert key in lines[0]
    else:
        assert "missing" in lines[0] or "no such file" in lines[0].lower()


# -- idle CPU and pick-up latency -----------------------------------------------------------


@pytest.mark.timeout(90)
def test_idle_cpu_and_pickup_latency(tmp_path, redis_url, r, queue, supervisors):
    cfg = config(tmp_path, redis_url, {queue.name: 2})
    (sup,) = supervisors(cfg)
    # one job first, so start-up work is over before measuring
    assert queue.enqueue("examples.add", 1, 1).wait(timeout=10) == 2

    before = cpu_seconds(sup.pid)
    watch_alive(sup, 2.0)
    idle = cpu_seconds(sup.pid) - before
    assert idle < 0.1, f"an idle supervisor used {idle:.3f}s CPU in 2s"

    waits = []
    for i in range(7):
        job = queue.enqueue("examples.add", i, 0)
        assert job.wait(timeout=10) == i
        f = queue.get(job.id).fields
        waits.append((f["started_at"] - f["enqueued_at"]) / 1000)
    waits.sort()
    median = waits[len(waits) // 2]
    # woken by the enqueue, not by the 2 s safety poll
    assert median < 0.2, f"pick-up latencies {waits}"
    assert waits[-1] < 1.0, f"pick-up latencies {waits}"
