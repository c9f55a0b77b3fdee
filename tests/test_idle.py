"""An idle supervisor sleeps (issue 27: idle CPU ≈ 0): its fast timers — the limits'
police and the stray sweep, every 50 ms — tick at `timers.IDLE_INTERVAL` while there is
nothing to watch, and a launched child hurries them back at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from forq import Queue
from forq.supervisor.loop.timers import IDLE_INTERVAL, Timers
from tests.helpers import wait_for, wait_job
from tests.redis_server import RedisServer
from tests.supervisors import SupervisorProcess, write_config


def run_until(timers: Timers, predicate, timeout: float = 5.0) -> None:
    """Drive the timers as the event loop does until `predicate()` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out driving the timers"
        time.sleep(timers.timeout(0.01))
        timers.run_due()


def test_a_ticker_slows_down_while_idle_and_a_hurry_brings_it_back():
    timers, idle, calls = Timers(), [False], []
    ticker = timers.every(0.01, lambda: calls.append(1), idle=lambda: idle[0])
    run_until(timers, lambda: len(calls) >= 3)
    assert not ticker.slow and timers.timeout(5.0) <= 0.01
    idle[0] = True
    run_until(timers, lambda: ticker.slow)  # the call after idleness began re-armed it slow
    assert timers.timeout(5.0) > 0.5 * IDLE_INTERVAL
    fired = timers.fired
    ticker.hurry()
    assert timers.timeout(5.0) <= 0.01
    run_until(timers, lambda: timers.fired > fired)
    assert timers.fired == fired + 1  # the slow call was cancelled, not run as well
    assert ticker.slow  # still idle: back to the slow pace after that one call
    idle[0] = False
    ticker.hurry()
    run_until(timers, lambda: timers.fired >= fired + 4)  # fast again: 3 calls in 10s of ms
    assert not ticker.slow


def test_a_ticker_never_ticks_faster_when_idle_than_when_busy():
    timers = Timers()
    ticker = timers.every(3.0, lambda: None, idle=lambda: True, idle_interval=1.0)
    assert ticker.idle_interval == 3.0


def wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of `pid`: how often it slept, and so
    how often it woke."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


@pytest.mark.timeout(60)
def test_an_idle_supervisor_wakes_a_few_times_a_second(tmp_path, redis_url, queue):
    """Counted by the kernel (voluntary context switches), not timed: with the police
    and the stray sweep every 50 ms it woke 24 times a second here; at their idle pace
    ~7 (those two, the reaper's pass, the heartbeat, the poll, the schedules' reload,
    each Redis round trip's wait)."""
    # the production defaults of the periods (a test config's are shorter)
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2},
                          drain_timeout="1s", lease_ttl="15s", reaper_interval="1s",
                          memory_sample_interval="50ms")
    with SupervisorProcess(config) as sup:
        # one job first: its end leaves the sweep at the fast pace for a while
        job = queue.enqueue("tests.echo", 1)
        assert wait_job(queue, job.id, ("succeeded",), timeout=20).state == "succeeded"
        time.sleep(3.0)  # the window after a job's end (strays.LINGER) runs out
        before = wakeups(sup.pid)
        time.sleep(4.0)
        per_second = (wakeups(sup.pid) - before) / 4.0
    assert per_second < 15, f"{per_second:.1f} wake-ups a second"


@pytest.mark.timeout(60)
def test_a_child_started_from_idle_is_policed_at_once(tmp_path, redis_url, queue):
    """Each job holds 96 MiB over its 64 MiB limit for 0.5 s only, then would succeed:
    policed every 50 ms from its start it dies; at the idle pace (1 s) a job would
    often outlive its overrun (about one job in two did, with the launch's `hurry` left
    out). Four in a row, one at a time, each started after the police may have gone idle
    again."""
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1},
                          drain_timeout="1s", supervisor_extra='job_cgroups = "off"')
    with SupervisorProcess(config) as sup:
        ids = [queue.enqueue("tests.hold_memory", 96, 0.5, memory_limit="64MiB",
                             max_attempts=1).id for _ in range(4)]
        for jid in ids:
            job = wait_job(queue, jid, ("succeeded", "dead"), timeout=30,
                           context=lambda: sup.log()[-3000:])
            assert job.state == "dead", (job.state, job.reason)
            assert job.error["type"] == "MemoryLimit", job.reason


@pytest.mark.timeout(90)
def test_an_idle_supervisor_trims_every_tenth_pass_and_a_queue_whose_job_ended_at_once(
        tmp_path):
    """Counted by a private Redis (INFO commandstats): each reaper pass's resume_tasks
    sends one HLEN, each trim one ZREMRANGEBYRANK (of the finished index; nothing else
    sends one while jobs succeed). Idle, a trim every `TRIM_IDLE_EVERY` passes. Then ten
    jobs one after another, each longer than a pass: each end is followed by a trim (the
    idle cadence alone would give two or three)."""
    from forq.supervisor.redis_io.reaper import TRIM_IDLE_EVERY

    with RedisServer() as server:
        queue = Queue("idle-trim", url=server.url)
        config = write_config(tmp_path / "forq.toml", server.url, {queue.name: 1},
                              reaper_interval="50ms")

        def counts() -> tuple[int, int]:
            stats = queue.redis.info("commandstats")
            return (int(stats.get("cmdstat_zremrangebyrank", {}).get("calls", 0)),
                    int(stats.get("cmdstat_hlen", {}).get("calls", 0)))

        with SupervisorProcess(config):
            wait_for(lambda: counts()[1] >= 4 * TRIM_IDLE_EVERY, timeout=30,
                     message="forty passes")
            trims, passes = counts()
            assert 1 <= trims <= passes // TRIM_IDLE_EVERY + 1, (trims, passes)
            trims, passes = counts()
            for _ in range(10):
                job = queue.enqueue("tests.lineage", 0.1)
                assert wait_job(queue, job.id, ("succeeded",), timeout=20).state == "succeeded"
            wait_for(lambda: counts()[1] > passes + 1, timeout=10, message="one more pass")
            after, during = counts()
            assert after - trims >= 9, (after - trims, during - passes)
