"""Flow control and scheduling through real `forq run` processes (issue 4).

Cron ticks fired exactly once by several supervisors and caught up after downtime by
policy; the global rate limit and max_in_flight held across supervisors and changed at
run time; effectively-once idempotent jobs; results and `Job.wait`; follow-up jobs
atomic with the ack; cancel of waiting and running jobs.

Several supervisors run as separate processes against the real Redis; tests wait on
conditions with deadlines (`wait_for`), never on a bare sleep. Where a test measures a
rate it waits for Redis's clock to pass a mark, and it reads the start times the claim
script wrote (Redis time), so no two clocks are compared.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib

from forq import JobFailed, Queue, examples, registry
from forq.errors import JobNotFound
from forq.job import Job
from forq.supervisor.config.load import ScheduleConfig
from forq.supervisor.leases.calls import leasing
from forq.supervisor.redis_io.scheduler import SCHEDULES, Scheduler
from tests import helpers
from tests import tasks as _tasks  # noqa: F401 — registers tests.fanout for the ghost runs
from tests.helpers import gone, wait_for
from tests.supervisors import REPO, SupervisorProcess, children_of, write_config

TERMINAL = ("succeeded", "dead", "cancelled")


# -- helpers ---------------------------------------------------------------------------------


def redis_ms(r: redis_lib.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_redis_ms(r: redis_lib.Redis, mark: int, timeout: float = 30.0) -> None:
    """Wait until Redis's clock reaches `mark` (ms): the span a rate is measured over."""
    wait_for(lambda: redis_ms(r) >= mark, timeout=timeout, interval=0.02,
             message=f"redis time {mark}")


@contextmanager
def running(*sups: SupervisorProcess, timeout: float = 30.0) -> Iterator[tuple]:
    """Start every supervisor at once (they start in parallel), wait until all are
    ready, and stop them all (SIGTERM, drain) afterwards."""
    try:
        for sup in sups:
            sup.start(wait_ready=False)
        for sup in sups:
            wait_for(lambda s=sup: "ready" in s.log() or s.proc.poll() is not None,
                     timeout=timeout, message="supervisor ready")
            assert sup.proc.poll() is None, f"supervisor exited:\n{sup.log()}"
        yield sups
    finally:
        for sup in sups:
            if sup.proc is not None and sup.proc.poll() is None:
                os.kill(sup.pid, signal.SIGCONT)
                sup.signal(signal.SIGTERM)
        for sup in sups:
            if sup.proc is not None:
                sup.stop(timeout=20)


def supervisors(tmp_path: Path, redis_url: str, queues: dict[str, int], count: int = 1,
                **options: Any) -> list[SupervisorProcess]:
    options.setdefault("drain_timeout", "2s")
    out = []
    for i in range(count):
        config = write_config(tmp_path / f"forq-{i}.toml", redis_url, queues,
                              name=f"flow{i}", **options)
        out.append(SupervisorProcess(config))
    return out


def logs(sups: list[SupervisorProcess] | tuple) -> str:
    return "\n".join(f"--- {s.config.name}\n{s.log()[-3000:]}" for s in sups)


def wait_job(queue: Queue, job_id: str, states: tuple[str, ...] = TERMINAL,
             timeout: float = 20.0, sups: tuple | list = ()) -> Job:
    return helpers.wait_job(queue, job_id, states, timeout, context=lambda: logs(sups))


def events(job: Job) -> list[str]:
    return [entry["event"] for entry in job.history]


def executions(path: Path) -> Counter:
    """How many times each job id started, from the lines tests.touch/fanout append."""
    if not path.exists():
        return Counter()
    return Counter(line.split()[0] for line in path.read_text().splitlines()
                   if line.endswith(" start"))


def records(r: redis_lib.Redis, queue: Queue, ids: list[str]) -> list[dict[str, str]]:
    pipe = r.pipeline(transaction=False)
    for jid in ids:
        pipe.hgetall(queue.keys.job(jid))
    return pipe.execute()


def owners(r: redis_lib.Redis, queue: Queue, ids: list[str]) -> set[str]:
    """The supervisors that claimed these jobs, from their histories."""
    pipe = r.pipeline(transaction=False)
    for jid in ids:
        pipe.lrange(queue.keys.history(jid), 0, -1)
    found = set()
    for history in pipe.execute():
        for raw in history:
            entry = json.loads(raw)
            if entry["event"] == "claimed":
                found.add(entry["owner"])
    return found


def sample_active(r: redis_lib.Redis, queue: Queue, done: Callable[[], bool],
                  timeout: float = 30.0) -> tuple[int, int]:
    """ZCARD of the active set every ~2 ms until `done()`; returns (peak, samples)."""
    peak = samples = 0
    deadline = time.monotonic() + timeout
    while True:
        peak = max(peak, r.zcard(queue.keys.active))
        samples += 1
        if samples % 25 == 0 and done():
            return peak, samples
        assert time.monotonic() < deadline, f"not done after {timeout}s (peak {peak})"
        time.sleep(0.002)


def succeeded(queue: Queue) -> int:
    return int(queue.redis.hget(queue.keys.stats, "succeeded") or 0)


@pytest.fixture
def make_queue(r: redis_lib.Redis) -> Iterator[Callable[[], Queue]]:
    """More fresh queues, removed afterwards like the `queue` fixture's."""
    made: list[str] = []

    def make() -> Queue:
        name = "t" + uuid.uuid4().hex[:12]
        made.append(name)
        return Queue(name, redis=r)

    yield make
    for name in made:
        keys = list(r.scan_iter(match=f"forq:{{{name}}}:*", count=1000))
        for start in range(0, len(keys), 500):
            r.delete(*keys[start:start + 500])
        r.srem("forq:queues", name)


@pytest.fixture
def schedule_name(r: redis_lib.Redis) -> Iterator[Callable[[str], str]]:
    """Fresh schedule names; their entries in the shared forq:schedules hash are removed."""
    made: list[str] = []

    def make(label: str) -> str:
        name = f"{label}-{uuid.uuid4().hex[:8]}"
        made.append(name)
        return name

    yield make
    if made:
        r.hdel(SCHEDULES, *made)


def schedule_toml(name: str, cron: str, queue: str, task: str = "examples.add",
                  args: list[Any] | None = None, **more: Any) -> str:
    lines = ["[[schedule]]", f'name = "{name}"', f'cron = "{cron}"', f'queue = "{queue}"',
             f'task = "{task}"', f"args = {json.dumps(args if args is not None else [1, 2])}"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in more.items()]
    return "\n".join(lines) + "\n"


def tick_jobs(r: redis_lib.Redis, queue: Queue, name: str) -> dict[int, list[dict[str, str]]]:
    """The jobs schedule `name` enqueued on `queue` (left pending: nobody serves it),
    grouped by the tick in their idempotency key `schedule:<name>:<tick ms>`."""
    ids = r.zrange(queue.keys.pending, 0, -1)
    out: dict[int, list[dict[str, str]]] = {}
    for record in records(r, queue, ids):
        key = record.get("key", "")
        prefix = f"schedule:{name}:"
        if key.startswith(prefix):
            out.setdefault(int(key[len(prefix):]), []).append(record)
    return out


def set_last_fired(r: redis_lib.Redis, name: str, when: dt.datetime) -> None:
    """Pretend schedule `name` last fired at `when` (how a long downtime looks)."""
    r.hset(SCHEDULES, name, json.dumps({"last": when.timestamp(), "job": "before-downtime"}))


# -- cron ------------------------------------------------------------------------------------


def test_cron_three_supervisors_enqueue_each_tick_exactly_once(tmp_path, redis_url, r, queue,
                                                               make_queue, schedule_name):
    target = make_queue()  # nobody serves it: every tick's job stays there to be counted
    name = schedule_name("every-second")
    extra = schedule_toml(name, "@every 1s", target.name)
    sups = supervisors(tmp_path, redis_url, {queue.name: 1}, count=3, extra=extra)
    with running(*sups):
        wait_for(lambda: r.zcard(target.keys.pending) >= 10, timeout=25, interval=0.1,
                 message="ten ticks")
    by_tick = tick_jobs(r, target, name)
    ticks = sorted(by_tick)
    assert len(ticks) >= 10, logs(sups)
    assert all(len(jobs) == 1 for jobs in by_tick.values()), "a tick enqueued twice"
    assert r.zcard(target.keys.pending) == len(ticks), "a job without its tick key"
    # consecutive seconds: no tick missing between the first and the last
    assert [b - a for a, b in zip(ticks, ticks[1:], strict=False)] == [1000] * (len(ticks) - 1)
    for tick, (record,) in by_tick.items():
        assert tick % 1000 == 0
        assert record["task"] == "examples.add" and json.loads(record["args"]) == [1, 2]
        # fired on time (Redis clock vs. tick): not before it, not a catch-up much later
        assert 0 <= int(record["enqueued_at"]) - tick < 2000, record
    # each tick was logged as fired by exactly one supervisor (the others got "duplicate")
    fired = sum(s.log().count(f"schedule {name}: fired tick") for s in sups)
    assert fired == len(ticks), logs(sups)
    last = json.loads(r.hget(SCHEDULES, name))
    assert int(round(last["last"] * 1000)) == ticks[-1]


def test_cron_catch_up_after_downtime_by_policy(tmp_path, redis_url, r, queue, make_queue,
                                                schedule_name):
    """A supervisor that was down for five hourly ticks: "none" fires none of them,
    "latest" only the last, "all" every one (bounded by max_catch_up)."""
    target = make_queue()
    now = dt.datetime.now(dt.timezone.utc)
    minute = (now.minute + 30) % 60  # hourly at a minute ~30 min away: no tick during the test
    cron = f"{minute} * * * *"
    latest = now.replace(second=0, microsecond=0)
    while latest.minute != minute:
        latest -= dt.timedelta(minutes=1)
    missed = [latest - dt.timedelta(hours=h) for h in (4, 3, 2, 1, 0)]
    names = {mode: schedule_name(f"catch-{mode}") for mode in ("none", "latest", "all3", "all")}
    probe = schedule_name("probe")
    extra = schedule_toml(probe, "@every 1s", target.name)
    for mode, name in names.items():
        more: dict[str, Any] = {"catch_up": mode.rstrip("3")}
        if mode == "all3":
            more["max_catch_up"] = 3
        extra += schedule_toml(name, cron, target.name, **more)
        set_last_fired(r, name, latest - dt.timedelta(hours=5))
    (sup,) = supervisors(tmp_path, redis_url, {queue.name: 1}, extra=extra)
    with running(sup):
        # the probe's first tick comes one call of the scheduler after its first look,
        # and every call handles every schedule: the catch-up decisions are all made
        wait_for(lambda: tick_jobs(r, target, probe), timeout=15, interval=0.05,
                 message="the probe schedule's first tick")
    ms = [int(t.timestamp() * 1000) for t in missed]
    fired = {mode: tick_jobs(r, target, name) for mode, name in names.items()}
    assert fired["none"] == {}, sup.log()
    assert sorted(fired["latest"]) == ms[-1:], sup.log()
    assert sorted(fired["all3"]) == ms[-3:], sup.log()
    assert sorted(fired["all"]) == ms, sup.log()
    for mode in ("latest", "all3", "all"):
        assert all(len(jobs) == 1 for jobs in fired[mode].values())
        assert json.loads(r.hget(SCHEDULES, names[mode]))["last"] == latest.timestamp()
    # "none" fired nothing, so its last fire time is still the one before the downtime
    assert json.loads(r.hget(SCHEDULES, names["none"]))["job"] == "before-downtime"


@pytest.mark.parametrize(("catch_up", "expected"), [("none", 1), ("latest", 1), ("all", 10)])
def test_cron_catch_up_of_a_frequent_schedule(r, make_queue, schedule_name, catch_up, expected):
    """The scheduler itself, with the clock in hand: an `@every 1s` schedule whose last
    fire was 30 s ago. "none" fires only the current tick (not the missed ones still
    inside the lateness grace), "latest" the last, "all" the last max_catch_up=10."""
    target = make_queue()
    name = schedule_name(f"frequent-{catch_up}")
    schedule = ScheduleConfig(name=name, cron="@every 1s", queue=target.name,
                              task="examples.add", catch_up=catch_up, max_catch_up=10,
                              every=1.0)
    tick = dt.datetime.fromtimestamp(int(time.time()) - 60, dt.timezone.utc)
    set_last_fired(r, name, tick - dt.timedelta(seconds=30))
    scheduler = Scheduler([schedule], r, lambda q: Queue(q, redis=r))
    scheduler.fire_due(now=tick + dt.timedelta(milliseconds=200))
    fired = sorted(tick_jobs(r, target, name))
    t = int(tick.timestamp() * 1000)
    assert fired == [t - 1000 * i for i in range(expected - 1, -1, -1)]
    # the next tick comes on time whatever the policy, and nothing fires twice
    scheduler.fire_due(now=tick + dt.timedelta(milliseconds=1100))
    scheduler.fire_due(now=tick + dt.timedelta(milliseconds=1200))
    assert sorted(tick_jobs(r, target, name)) == [*fired, t + 1000]


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("cron", "61 * * * *", 'cron: expected a valid cron expression'),
    ("cron", "@fortnightly", "cron: expected one of"),
    ("timezone", "Mars/Olympus_Mons", "timezone: expected an IANA time zone"),
])
def test_cron_bad_expression_or_timezone_is_a_config_error_naming_the_schedule(
        tmp_path, redis_url, field, value, expected):
    more = {"timezone": value} if field == "timezone" else {}
    cron = value if field == "cron" else "0 3 * * *"
    extra = schedule_toml("nightly-report", cron, "reports", "examples.report", **more)
    config = write_config(tmp_path / "forq.toml", redis_url, {"reports": 1}, extra=extra)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for args in (["config", "check", str(config)], ["run", "--config", str(config)]):
        proc = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", *args], cwd=str(REPO),
                              capture_output=True, text=True, timeout=30, env=env)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert f'[schedule "nightly-report"].{expected}' in proc.stderr, proc.stderr
        assert str(config) in proc.stderr and repr(value).strip("'") in proc.stderr


# -- global limits ---------------------------------------------------------------------------


def per_window(starts: list[int], origin: int, windows: int, size: int = 1000) -> list[int]:
    return [sum(1 for s in starts if origin + k * size <= s < origin + (k + 1) * size)
            for k in range(windows)]


def test_rate_limit_holds_across_three_supervisors_and_changes_at_run_time(
        tmp_path, redis_url, r, queue):
    # rates a loaded 2-core machine still keeps up with (forks per second), so the lower
    # bounds below test the limiter, not the machine
    rate, faster_rate = 10, 20
    sups = supervisors(tmp_path, redis_url, {queue.name: 4}, count=3,
                       queue_extra=f'rate_limit = "{rate}/s"\n')
    with running(*sups):
        limits = queue.limits()
        assert limits["rate"] == pytest.approx(rate / 1000) and limits["burst"] == 1.0
        ids = [j.id for j in queue.enqueue_many(
            {"task": "examples.add", "args": [i, 1]} for i in range(120))]
        enqueued = redis_ms(r)
        wait_redis_ms(r, enqueued + 5_600)
        queue.set_limits(rate=(faster_rate, 1))  # at run time, no restart
        changed = redis_ms(r)
        wait_redis_ms(r, changed + 2_100)
        lifted = redis_ms(r)
        queue.set_limits(rate=None)  # and off
        wait_for(lambda: succeeded(queue) == len(ids), timeout=30, interval=0.05,
                 message="every job")
    starts = sorted(int(rec["started_at"]) for rec in records(r, queue, ids))
    assert len(starts) == len(ids) and all(rec["state"] == "succeeded"
                                           for rec in records(r, queue, ids))
    first = starts[0]
    assert first - enqueued < 1000
    windows = per_window(starts, first, 5)
    # never above the limit in a one-second window (the bucket holds at most one token
    # of burst), and close to it over the five seconds: the supervisors were kept busy
    assert max(windows) <= rate + 1, windows
    assert 0.9 * 5 * rate <= sum(windows) <= 5 * rate + 1, windows
    faster = per_window(starts, changed, 2)
    assert max(faster) <= faster_rate + 1, faster
    assert 0.8 * 2 * faster_rate <= sum(faster) <= 2 * faster_rate + 1, faster
    # lifted: the rest started as fast as slots freed, more in a quarter second than
    # the faster rate could ever allow (20/s: 5 + 1): the supervisors claimed full batches
    rest = [s for s in starts if s >= lifted]
    assert len(rest) >= 12, len(rest)
    assert max(per_window(rest, rest[0], 1, size=250)) >= 8, rest
    assert len(owners(r, queue, ids)) >= 2  # the limit held while several claimed


def test_rate_limit_fills_free_slots_at_the_rate_while_long_jobs_run(tmp_path, redis_url, r,
                                                                     queue):
    """A claim the bucket serves only in part must still say when the next token comes:
    the supervisor's other free slots fill at the rate, not when a long job ends."""
    (sup,) = supervisors(tmp_path, redis_url, {queue.name: 4}, queue_extra='rate_limit = "10/s"\n')
    with running(sup):
        ids = [j.id for j in queue.enqueue_many(
            {"task": "examples.sleep", "args": [1.5]} for _ in range(4))]
        peak, _ = sample_active(r, queue, lambda: r.zcard(queue.keys.active) == 4, timeout=10)
        starts = sorted(int(rec["started_at"]) for rec in records(r, queue, ids))
    # one token at once, then one every 100 ms: all four within ~300 ms, long before
    # the first job ends (1.5 s)
    assert starts[-1] - starts[0] < 800, starts
    assert all(b - a >= 90 for a, b in zip(starts, starts[1:], strict=False)), starts


def test_max_in_flight_across_three_supervisors_sampled_continuously(tmp_path, redis_url, r,
                                                                     queue):
    runs = tmp_path / "runs"
    sups = supervisors(tmp_path, redis_url, {queue.name: 4}, count=3,
                       queue_extra="max_in_flight = 3\n")
    with running(*sups):
        assert queue.limits()["max_in_flight"] == 3
        ids = [j.id for j in queue.enqueue_many(
            {"task": "tests.touch", "args": [str(runs), 0.3]} for _ in range(15))]
        peak, samples = sample_active(r, queue, lambda: succeeded(queue) == 15)
        assert peak == 3, (peak, samples)  # reached, never above
        assert samples > 200
        # the children themselves never overlapped more than three at a time
        running_now = most = 0
        for line in runs.read_text().splitlines():
            running_now += 1 if line.endswith(" start") else -1
            most = max(most, running_now)
        assert most <= 3
        assert len(owners(r, queue, ids)) >= 2, logs(sups)

        # changed at run time: down to one...
        queue.set_limits(max_in_flight=1)
        queue.enqueue_many({"task": "tests.touch", "args": [str(runs), 0.15]} for _ in range(4))
        peak, _ = sample_active(r, queue, lambda: succeeded(queue) == 19)
        assert peak == 1
        # ...then lifted: the twelve slots of the three supervisors fill up
        queue.set_limits(max_in_flight=None)
        queue.enqueue_many({"task": "tests.touch", "args": [str(runs), 0.6]} for _ in range(8))
        peak, _ = sample_active(r, queue, lambda: succeeded(queue) == 27)
        assert peak >= 6, peak
    assert sum(executions(runs).values()) == 27


# -- idempotency -------------------------------------------------------------------------------


def test_idempotent_ack_lost_then_reclaimed_is_succeeded_not_rerun(queue, r):
    """At the API level, deterministically: claimed, completion recorded, ack lost."""
    jid = queue.enqueue("t.charge", idempotent=True, keep_history=True).id
    (lease,) = leasing(queue).claim("ghost:1", 1, 50).leases  # a 50 ms lease nobody extends
    leasing(queue).record_done(jid, json.dumps({"charged": 10}), 60_000)
    # the ack never comes; once the lease has expired the reaper finds the completion
    reply = wait_for(lambda: (rep := leasing(queue).reclaim("reaper"))[3] and rep, timeout=5)
    assert reply == (0, 0, 1, [jid])
    job = queue.get(jid)
    assert job.state == "succeeded" and job.result == {"charged": 10}
    assert job.crashes == 0 and job.attempts == 1
    assert events(job) == ["enqueued", "claimed", "succeeded"]
    assert job.history[-1]["source"] == "completion recorded before"
    # never handed out again, and the late ack of the first run changes nothing
    assert leasing(queue).claim("ghost:2", 10, 60_000).leases == []
    assert leasing(queue).ack(jid, lease.token, "1") == "lost"
    assert queue.get(jid).result == {"charged": 10}


def followups_of(job_id: str, queue: Queue, *items: int) -> list[dict[str, Any]]:
    """The follow-up specs a handler asking for `t.child(item)` per item would send."""
    ctx = registry.JobContext(job_id, queue.name, "t.parent")
    for item in items:
        ctx.enqueue("t.child", item)
    return ctx.followups


def test_completion_record_keeps_the_followups_a_lost_ack_carried(queue, r):
    """The same-queue follow-ups travel in the ack. When the ack is lost, the completion
    record brings them: whichever of claim or reclaim finds it enqueues them, once."""
    lost_ack, released = (j.id for j in queue.enqueue_many([{"task": "t.parent", "keep_history": True}] * 2))
    leases = {lease.id: lease for lease in leasing(queue).claim("ghost:1", 2, 50).leases}
    leasing(queue).record_done(lost_ack, '"A"', 60_000, followups=followups_of(lost_ack, queue, 1, 2))
    leasing(queue).record_done(released, '"B"', 60_000, followups=followups_of(released, queue, 3))
    # one lease goes back to pending (a drain) before its ack: the next claim finds the
    # record, succeeds it instead of leasing it, and enqueues its follow-up
    assert leasing(queue).release(released, leases[released].token) == "ok"
    assert leasing(queue).claim("ghost:2", 10, 60_000).leases == []
    # the other's ack is lost: once its lease expires the reaper does the same
    wait_for(lambda: leasing(queue).reclaim("reaper")[2], timeout=5, message="the reclaim")
    for jid, result, children in ((lost_ack, "A", 2), (released, "B", 1)):
        job = queue.get(jid)
        assert job.state == "succeeded" and job.result == result
        assert job.history[-1]["source"] == "completion recorded before"
        for n in range(1, children + 1):
            child = queue.get(f"{jid}-{n}")
            assert child.state == "pending" and child.task == "t.child"
            assert child.fields["parent"] == jid and events(child) == ["enqueued"]
    assert r.zcard(queue.keys.pending) == 3
    # found again (another reclaim, a late duplicate of the record): nothing added
    assert leasing(queue).reclaim("reaper") == (0, 0, 0, [])
    assert leasing(queue).ack(lost_ack, leases[lost_ack].token, '"A"',
                     followups_of(lost_ack, queue, 1, 2)) == "lost"
    assert r.zcard(queue.keys.pending) == 3
    leased = sorted(lease.id for lease in leasing(queue).claim("ghost:3", 10, 60_000).leases)
    assert leased == sorted([f"{lost_ack}-1", f"{lost_ack}-2", f"{released}-1"])


def test_idempotent_job_through_a_supervisor_records_completion_with_the_ttl(
        tmp_path, redis_url, r, queue):
    runs = tmp_path / "runs"
    (sup,) = supervisors(tmp_path, redis_url, {queue.name: 2},
                         defaults='idempotency_ttl = "1h"')
    with running(sup):
        jid = queue.enqueue("tests.touch", str(runs), idempotent=True).id
        declared = queue.enqueue("examples.vote", "item-1", "ada").id  # @task(idempotent=True)
        plain = queue.enqueue("tests.touch", str(runs)).id
        for job_id in (jid, declared, plain):
            assert wait_job(queue, job_id, sups=[sup]).state == "succeeded"
    for job_id in (jid, declared):
        marker = queue.keys.done(job_id)
        assert r.get(marker) == queue.get(job_id).fields["result"]
        assert 3_600_000 - 60_000 < r.pttl(marker) <= 3_600_000
    assert not r.exists(queue.keys.done(plain))
    # the vote's ack enqueued its follow-up: no copy of it is kept beside the record
    assert queue.get(f"{declared}-1").fields["parent"] == declared
    assert not r.exists(queue.keys.done_followups(declared))
    assert executions(runs) == Counter({jid: 1, plain: 1})


def test_idempotent_ack_lost_is_acked_by_a_supervisors_reaper_and_its_followup_kept(
        tmp_path, redis_url, r, queue):
    """A supervisor ran an idempotent job and recorded its completion (with the
    same-queue follow-up it asked for), then died before its ack. Another supervisor's
    reaper finds the completion: the job succeeds without running again, and the
    follow-up is enqueued exactly once and runs."""
    runs = tmp_path / "runs"
    jid = queue.enqueue("tests.touch", str(runs), idempotent=True, keep_history=True).id
    vid = queue.enqueue("examples.vote", "item-7", "ada", keep_history=True).id
    for job_id, (lease, ) in ((jid, leasing(queue).claim("ghost:1", 1, 100).leases),
                             (vid, leasing(queue).claim("ghost:1", 1, 100).leases)):
        assert lease.id == job_id
    leasing(queue).record_done(jid, json.dumps(4242), 60_000)
    # what the dead supervisor's child did: run the handler, collecting its follow-ups
    ctx = registry.JobContext(vid, queue.name, "examples.vote")
    registry.set_current(ctx)
    try:
        result = examples.vote("item-7", "ada")
    finally:
        registry.set_current(None)
    leasing(queue).record_done(vid, json.dumps(result), 60_000, followups=ctx.followups)
    (sup,) = supervisors(tmp_path, redis_url, {queue.name: 2})
    with running(sup):
        job = wait_job(queue, jid, sups=[sup])
        vote = wait_job(queue, vid, sups=[sup])
        recount = wait_job(queue, f"{vid}-1", sups=[sup])
    assert job.state == "succeeded" and job.result == 4242
    assert not runs.exists()  # the handler never ran again
    for done in (job, vote):
        assert events(done) == ["enqueued", "claimed", "succeeded"], done.history
        assert done.history[1]["owner"] == "ghost:1"
    assert vote.result == "ada voted for item-7"
    assert recount.state == "succeeded" and recount.result == "recounted item-7"
    assert recount.fields["parent"] == vid
    assert events(recount).count("claimed") == 1


# -- results ---------------------------------------------------------------------------------


def test_results_wait_errors_ttl_and_size(tmp_path, redis_url, r, queue):
    (sup,) = supervisors(tmp_path, redis_url, {queue.name: 3})
    with running(sup):
        added = queue.enqueue("examples.add", 2, 3)
        fatal = queue.enqueue("tests.fatal")
        kept_none = queue.enqueue("examples.add", 4, 5, result_ttl=0)
        short = queue.enqueue("examples.add", 6, 7, result_ttl="1h")
        too_big = queue.enqueue("tests.big_result", 2_000, max_result_bytes=1_000)
        huge = queue.enqueue("tests.big_result", 3_000_000)  # over the 1 MiB default
        assert added.wait(timeout=20) == 5
        with pytest.raises(JobFailed) as failed:
            fatal.wait(timeout=20)
        assert failed.value.state == "dead"
        assert failed.value.reason == "NonRetryable: cannot ever work"
        assert "cannot ever work" in str(failed.value)
        assert short.wait(timeout=20) == 13
        for big, size in ((too_big, 1_000), (huge, 1 << 20)):
            with pytest.raises(JobFailed) as failed:
                big.wait(timeout=20)
            assert failed.value.state == "dead"
            assert failed.value.reason.startswith("result too large")
            assert f"{size}-byte max_result_bytes" in failed.value.reason
            job = queue.get(big.id)
            assert job.attempts == 1 and "result" not in job.fields  # no retry, no result
        # result_ttl=0 keeps nothing: the record and its history go with the success
        wait_for(lambda: not r.exists(queue.keys.job(kept_none.id)), timeout=20,
                 message="the result_ttl=0 record to go")
    assert not r.exists(queue.keys.history(kept_none.id))
    with pytest.raises(JobNotFound):
        queue.get(kept_none.id)
    assert succeeded(queue) == 3
    # result_ttl caps the keep (1 h here too): the reaper trims it then (no key expiry)
    record = r.hgetall(queue.keys.job(short.id))
    until = r.zscore(queue.keys.kept_bucket("succeeded:10000"), short.id)
    assert until == int(record["finished_at"]) + 3_600_000


# -- follow-up jobs --------------------------------------------------------------------------


def test_followups_same_queue_and_other_queue_with_deterministic_ids(tmp_path, redis_url, r,
                                                                     queue, make_queue):
    runs = tmp_path / "runs"
    other = make_queue()
    (sup,) = supervisors(tmp_path, redis_url, {queue.name: 2, other.name: 2})
    with running(sup):
        vid = queue.enqueue("examples.vote", "item-3", "bob").id
        pid = queue.enqueue("tests.fanout", str(runs), other.name).id
        recount = wait_job(queue, f"{vid}-1", sups=[sup])
        there = wait_job(other, f"{pid}-1", sups=[sup])
        here = wait_job(queue, f"{pid}-2", sups=[sup])
        parent = wait_job(queue, pid, sups=[sup])
    assert wait_job(queue, vid).state == "succeeded"
    assert recount.state == "succeeded" and recount.result == "recounted item-3"
    assert parent.result == {"there": f"{pid}-1", "here": f"{pid}-2"}
    for job, where in ((recount, queue), (there, other), (here, queue)):
        assert job.queue == where.name and job.fields["parent"] in (vid, pid)
        assert job.state == "succeeded"
        assert job.history[0]["parent"] == job.fields["parent"]
    assert executions(runs) == Counter({pid: 1, f"{pid}-1": 1, f"{pid}-2": 1})
    assert not r.exists(other.keys.job(f"{pid}-2")) and not r.exists(queue.keys.job(f"{pid}-1"))


def test_followups_never_duplicated_when_the_parent_runs_again(tmp_path, redis_url, r, queue,
                                                               make_queue):
    """A supervisor ran the parent and sent its other-queue follow-up, then died before
    the ack (which carries the same-queue one). The lease expires, the parent runs again
    elsewhere and asks for the same follow-ups: each exists once and runs once."""
    runs = tmp_path / "runs"
    other = make_queue()
    pid = queue.enqueue("tests.fanout", str(runs), other.name).id
    (lease,) = leasing(queue).claim("ghost:1", 1, 100).leases
    ctx = registry.JobContext(pid, queue.name, "tests.fanout")
    registry.set_current(ctx)
    try:
        registry.lookup("tests.fanout").func(str(runs), other.name)
    finally:
        registry.set_current(None)
    pipe = r.pipeline(transaction=False)
    other.send_specs([f for f in ctx.followups if f["queue"] == other.name], pipe)
    pipe.execute()  # ...and the ghost dies here, before its ack
    (sup,) = supervisors(tmp_path, redis_url, {queue.name: 2, other.name: 2})
    with running(sup):
        parent = wait_job(queue, pid, sups=[sup])
        there = wait_job(other, f"{pid}-1", sups=[sup])
        here = wait_job(queue, f"{pid}-2", sups=[sup])
        # a second ack of the first run, arriving late, is fenced off: nothing changes
        assert leasing(queue).ack(pid, lease.token, "null", ctx.followups) == "lost"
    assert parent.state == "succeeded" and parent.crashes == 1  # reclaimed, run again
    assert there.state == here.state == "succeeded"
    assert executions(runs) == Counter({pid: 2, f"{pid}-1": 1, f"{pid}-2": 1})
    assert r.zcard(other.keys.pending) == 0 and r.zcard(queue.keys.pending) == 0
    assert events(there).count("enqueued") == 1 and events(here).count("enqueued") == 1


# -- cancel ----------------------------------------------------------------------------------


def test_cancel_pending_and_scheduled_jobs(tmp_path, redis_url, r, queue):
    runs = tmp_path / "runs"
    pending = queue.enqueue("tests.touch", str(runs))
    assert queue.cancel(pending.id) == "cancelled"
    with pytest.raises(JobFailed) as failed:
        pending.wait(timeout=1)
    assert failed.value.state == "cancelled"
    assert queue.cancel(pending.id) == "cancelled"  # already: says so, changes nothing
    assert queue.cancel("no-such-job") == "missing"
    (sup,) = supervisors(tmp_path, redis_url, {queue.name: 2})
    with running(sup):
        later = queue.enqueue("tests.touch", str(runs), delay="400ms")
        barrier = queue.enqueue("tests.touch", str(runs), delay="600ms")
        assert queue.get(later.id).state == "scheduled"
        assert queue.cancel(later.id) == "cancelled"
        assert wait_job(queue, barrier.id, sups=[sup]).state == "succeeded"
    for job in (pending, later):
        job = queue.get(job.id)
        assert job.state == "cancelled" and events(job)[-1] == "cancelled"
        assert "claimed" not in events(job)
    assert r.zcard(queue.keys.pending) == r.zcard(queue.keys.scheduled) == 0
    assert executions(runs) == Counter({barrier.id: 1})


def test_cancel_active_job_stops_its_child_within_one_extension_period(tmp_path, redis_url, r,
                                                                       queue):
    lease_ttl = 1.0
    (sup,) = supervisors(tmp_path, redis_url, {queue.name: 1}, lease_ttl="1s")
    with running(sup):
        jid = queue.enqueue("examples.sleep", 20).id
        wait_job(queue, jid, ("active",), sups=[sup])
        (child,) = wait_for(lambda: children_of(sup.pid), timeout=10, message="the child")
        asked = time.monotonic()
        assert queue.cancel(jid) == "cancelling"
        job = wait_job(queue, jid, timeout=10, sups=[sup])
        took = time.monotonic() - asked
        assert job.state == "cancelled", job.history
        assert took <= lease_ttl / 3 + 0.5, took
        assert gone(child)
        # no retry: with its only slot free the supervisor runs the next job, and the
        # cancelled one stays cancelled, claimed once
        nxt = queue.enqueue("examples.add", 1, 1)
        assert nxt.wait(timeout=10) == 2
        job = queue.get(jid)
    assert job.state == "cancelled" and events(job).count("claimed") == 1
    assert "retry" not in events(job) and events(job)[-1] == "cancelled"
    assert r.zscore(queue.keys.scheduled, jid) is None and r.zscore(queue.keys.active, jid) is None
    assert f"job {jid} examples.sleep: cancelled, stopping its child" in sup.log()
