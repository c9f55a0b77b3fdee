"""Every state transition and every refusal, through `jobs.Queue`, on a real Redis.

Each test drives the Lua scripts through the public API and then reads the job's
record, its history and the queue's sorted sets straight from Redis, so a script that
changes the wrong key, forgets one, or answers without changing anything fails here.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid

import pytest

from forq import JobNotFound, PayloadError, Queue, find_job
from forq.job import Job
from forq.supervisor.leases.calls import LeaseCalls, leasing
from tests.helpers import wait_for
from tests.redis_server import RedisServer

OWNER = "host-a:100"
LONG = 60_000  # a lease that will not expire during a test (ms)


# -- helpers -------------------------------------------------------------------------


def redis_ms(r) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def wait_redis_past(r, deadline_ms: int, timeout: float = 10.0) -> None:
    """Wait until the Redis clock is strictly past `deadline_ms` (a lease or a run-at)."""
    wait_for(lambda: redis_ms(r) > deadline_ms, timeout=timeout, interval=0.002,
             message=f"Redis time past {deadline_ms}")


def where(queue: Queue, job_id: str) -> list[str]:
    """The queue sets that hold this job id (a live job is in exactly one)."""
    r = queue.redis
    k = queue.keys
    return [name for name, key in (("pending", k.pending), ("scheduled", k.scheduled),
                                   ("active", k.active), ("dead", k.dead))
            if r.zscore(key, job_id) is not None]


def raw(queue: Queue, job_id: str) -> tuple[dict, list]:
    r = queue.redis
    return r.hgetall(queue.keys.job(job_id)), r.lrange(queue.keys.history(job_id), 0, -1)


def events(job: Job) -> list[str]:
    return [e["event"] for e in job.history]


def claim_one(queue: Queue, ttl: int = LONG, owner: str = OWNER, policy: str = ""):
    result = leasing(queue).claim(owner, 1, ttl, policy)
    assert len(result.leases) == 1, result
    return result.leases[0]


@pytest.fixture
def other_queue(r):
    name = "t" + uuid.uuid4().hex[:12]
    q = Queue(name, redis=r)
    yield q
    keys = list(r.scan_iter(match=f"forq:{{{name}}}:*", count=1000))
    if keys:
        r.delete(*keys)
    r.srem("forq:queues", name)


# -- enqueue ---------------------------------------------------------------------------


def test_enqueue_due_now_is_pending_with_its_record_and_history(queue, r):
    before = redis_ms(r)
    handle = queue.enqueue("mail.send", "ada@example.com", 3, priority=4)
    assert handle.fields["enqueue_status"] == "pending"
    job = queue.get(handle.id)
    assert job.state == "pending"
    assert job.task == "mail.send"
    assert job.args == ["ada@example.com", 3]
    assert job.kwargs == {}
    assert job.fields["priority"] == 4
    assert job.attempts == 0 and job.crashes == 0
    assert before <= job.fields["enqueued_at"] <= redis_ms(r)
    assert job.fields["run_at"] == job.fields["enqueued_at"]
    assert where(queue, handle.id) == ["pending"]
    assert events(job) == ["enqueued"]
    assert r.sismember("forq:queues", queue.name)


def test_enqueue_with_delay_is_scheduled_until_due(queue, r):
    handle = queue.enqueue("t.x", delay="1h")
    assert handle.fields["enqueue_status"] == "scheduled"
    job = queue.get(handle.id)
    assert job.state == "scheduled"
    assert job.fields["run_at"] == job.fields["enqueued_at"] + 3_600_000
    assert where(queue, handle.id) == ["scheduled"]
    assert r.zscore(queue.keys.scheduled, handle.id) == job.fields["run_at"]
    assert events(job) == ["enqueued"]
    assert job.history[0]["run_at"] == job.fields["run_at"]
    # not claimable before it is due, and the claim reports when it will be
    result = leasing(queue).claim(OWNER, 10, LONG)
    assert result.leases == []
    assert result.next_due_ms == job.fields["run_at"]


def test_enqueue_with_run_at(queue, r):
    future = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    scheduled = queue.enqueue("t.x", run_at=future)
    assert scheduled.fields["enqueue_status"] == "scheduled"
    assert queue.get(scheduled.id).fields["run_at"] == int(future.timestamp() * 1000)
    past = queue.enqueue("t.x", run_at=time.time() - 60)
    assert past.fields["enqueue_status"] == "pending"
    assert where(queue, past.id) == ["pending"]
    assert where(queue, scheduled.id) == ["scheduled"]


def test_enqueue_stores_every_option(queue):
    handle = queue.enqueue(
        "t.opts", kwargs={"to": "bob"}, job_id="my-own-id", max_attempts=7, max_crashes=2,
        timeout="30s", memory_limit="64MiB", result_ttl="10m", max_result_bytes="1KiB",
        backoff={"base": "250ms", "factor": 3, "max": "1m", "jitter": 0.1}, idempotent=True,
        priority=-3,
    )
    assert handle.id == "my-own-id"
    f = queue.get("my-own-id").fields
    assert queue.get("my-own-id").kwargs == {"to": "bob"}
    assert f["max_attempts"] == 7
    assert f["max_crashes"] == 2
    assert f["timeout_ms"] == 30_000
    assert f["memory_limit"] == 64 * 1024 * 1024
    assert f["result_ttl_ms"] == 600_000
    assert f["max_result_bytes"] == 1024
    assert f["backoff_base_ms"] == 250
    assert float(f["backoff_factor"]) == 3.0
    assert f["backoff_max_ms"] == 60_000
    assert float(f["backoff_jitter"]) == pytest.approx(0.1)
    assert f["idempotent"] == "1"
    assert f["priority"] == -3


def test_enqueue_same_job_id_twice_is_a_duplicate_not_a_second_job(queue):
    first = queue.enqueue("t.x", 1, job_id="fixed")
    second = queue.enqueue("t.x", 2, job_id="fixed")
    assert first.fields["enqueue_status"] == "pending"
    assert second.id == "fixed" and second.fields["enqueue_status"] == "duplicate"
    assert queue.get("fixed").args == [1]
    assert queue.redis.zcard(queue.keys.pending) == 1


# -- claim -------------------------------------------------------------------------------


def test_claim_sets_the_lease(queue, r):
    jid = queue.enqueue("t.x").id
    before = redis_ms(r)
    lease = claim_one(queue, ttl=30_000)
    after = redis_ms(r)
    assert lease.id == jid
    f = queue.get(jid).fields
    assert f["state"] == "active"
    assert f["owner"] == OWNER
    assert f["token"] == lease.token
    assert before + 30_000 <= f["lease_deadline"] <= after + 30_000
    assert f["started_at"] <= f["lease_deadline"] - 30_000 + 1
    assert r.zscore(queue.keys.active, jid) == f["lease_deadline"]
    assert where(queue, jid) == ["active"]
    job = queue.get(jid)
    assert events(job) == ["enqueued", "claimed"]
    assert job.history[1]["owner"] == OWNER
    assert str(job.history[1]["token"]) == lease.token
    # the lease the claim returns is the record as stored
    assert lease.job.fields["token"] == lease.token
    assert lease.job.state == "active"


def test_every_claim_gets_a_fresh_token(queue):
    a = queue.enqueue("t.x").id
    queue.enqueue("t.x")
    first = claim_one(queue)
    assert first.id == a
    assert leasing(queue).release(a, first.token) == "ok"
    second = claim_one(queue)
    assert second.id == a
    third = claim_one(queue)
    tokens = {first.token, second.token, third.token}
    assert len(tokens) == 3
    # the first token no longer works for anything
    assert leasing(queue).ack(a, first.token, "1") == "lost"


def test_claim_leases_at_most_n(queue):
    ids = [j.id for j in queue.enqueue_many({"task": "t.x", "args": [i]} for i in range(5))]
    result = leasing(queue).claim(OWNER, 3, LONG)
    assert [lease.id for lease in result.leases] == ids[:3]
    assert result.pending_left == 2
    assert queue.redis.zcard(queue.keys.active) == 3
    assert queue.redis.zcard(queue.keys.pending) == 2
    rest = leasing(queue).claim(OWNER, 10, LONG)
    assert [lease.id for lease in rest.leases] == ids[3:]
    assert rest.pending_left == 0
    assert leasing(queue).claim(OWNER, 10, LONG).leases == []


def test_claim_priority_order_then_fifo(queue):
    spec = [("low", -1), ("zero-a", 0), ("five-a", 5), ("ten", 10), ("five-b", 5),
            ("zero-b", 0), ("five-c", 5)]
    for name, prio in spec:
        queue.enqueue("t.x", job_id=name, priority=prio)
    claimed = [lease.id for lease in leasing(queue).claim(OWNER, 10, LONG).leases]
    assert claimed == ["ten", "five-a", "five-b", "five-c", "zero-a", "zero-b", "low"]


def test_claim_promotes_due_scheduled_jobs(queue, r):
    later = queue.enqueue("t.x", delay="1h").id
    soon = queue.enqueue("t.x", delay="30ms").id
    run_at = queue.get(soon).fields["run_at"]
    assert leasing(queue).claim(OWNER, 10, LONG).leases == []
    wait_redis_past(r, run_at)
    result = leasing(queue).claim(OWNER, 10, LONG)
    assert [lease.id for lease in result.leases] == [soon]
    assert result.next_due_ms == queue.get(later).fields["run_at"]
    assert where(queue, soon) == ["active"]
    assert where(queue, later) == ["scheduled"]


def test_promoted_jobs_keep_priority_order(queue, r):
    queue.enqueue("t.x", job_id="plain")
    queue.enqueue("t.x", job_id="urgent-later", delay="20ms", priority=9)
    wait_redis_past(r, queue.get("urgent-later").fields["run_at"])
    assert [lease.id for lease in leasing(queue).claim(OWNER, 5, LONG).leases] == ["urgent-later", "plain"]


def test_claim_policy_fills_unset_limits_but_never_overrides(queue):
    queue.enqueue("t.plain", job_id="plain")
    queue.enqueue("t.plain", job_id="producer-set", max_attempts=7, timeout="2s")
    queue.enqueue("t.special", job_id="special")
    policy = json.dumps({
        "defaults": {"max_attempts": 3, "timeout_ms": 60_000, "max_crashes": 4,
                     "backoff_factor": 1.5},
        "tasks": {"t.special": {"max_attempts": 9, "timeout_ms": 5_000, "max_crashes": 4,
                                "backoff_factor": 1.5}},
    })
    leases = {lease.id: lease for lease in leasing(queue).claim(OWNER, 10, LONG, policy).leases}
    assert set(leases) == {"plain", "producer-set", "special"}
    plain = queue.get("plain").fields
    assert plain["max_attempts"] == 3 and plain["timeout_ms"] == 60_000
    assert plain["max_crashes"] == 4 and float(plain["backoff_factor"]) == 1.5
    mine = queue.get("producer-set").fields
    assert mine["max_attempts"] == 7 and mine["timeout_ms"] == 2_000
    assert mine["max_crashes"] == 4
    special = queue.get("special").fields
    assert special["max_attempts"] == 9 and special["timeout_ms"] == 5_000
    # the returned lease carries the filled-in limits too
    assert int(leases["plain"].job.fields["max_attempts"]) == 3


def test_policy_is_stored_once_and_read_by_fail_and_reclaim(queue, r):
    """The policy lives in one hash per distinct policy; a job stores only its name (and
    the result_ttl_ms every ack needs), and the first claim's policy stays the job's."""
    first = json.dumps({"defaults": {"max_attempts": 2, "backoff_base_ms": 60_000,
                                     "backoff_factor": 1, "backoff_max_ms": 60_000,
                                     "backoff_jitter": 0, "result_ttl_ms": 5_000},
                        "tasks": {"t.crashy": {"max_crashes": 1}}})
    later = json.dumps({"defaults": {"max_attempts": 9, "backoff_base_ms": 1}, "tasks": {}})
    queue.enqueue("t.plain", job_id="plain")
    queue.enqueue("t.crashy", job_id="crashy")
    leases = {lease.id: lease for lease in leasing(queue).claim(OWNER, 5, LONG, first).leases}
    stored = r.hgetall(queue.keys.job("plain"))
    assert "max_attempts" not in stored and "backoff_base_ms" not in stored
    assert stored["result_ttl_ms"] == "5000" and stored["policy"]
    assert r.hgetall(queue.keys.policy(stored["policy"]))["max_crashes:t.crashy"] == "1"
    # fail reads the backoff from the stored policy: a retry a minute later
    out = leasing(queue).fail("plain", leases["plain"].token, {"message": "boom"})
    assert out.outcome == "retry"
    assert 59_000 <= out.run_at_ms - int(queue.get("plain").fields["finished_at"]) <= 60_000
    # reclaim reads the task's max_crashes from it: one crash is the end
    leasing(queue).expire("crashy", leases["crashy"].token, "killed by SIGKILL")
    assert leasing(queue).reclaim("reaper:1")[:2] == (0, 1)
    assert queue.get("crashy").state == "dead"
    # a later claim under another policy leaves the job's policy (and its limits) alone
    r.zadd(queue.keys.scheduled, {"plain": 0})
    again = claim_one(queue, policy=later)
    assert again.job.fields["max_attempts"] == 2 and r.hget(
        queue.keys.job("plain"), "policy") == stored["policy"]
    assert leasing(queue).fail("plain", again.token, {"message": "boom"}).outcome == "dead"


def test_ack_many_acks_each_job_by_its_own_token(queue, r):
    """One ack call for several jobs: each is fenced alone, a stale one changes nothing,
    follow-ups go with their own job, and the counters count what succeeded."""
    for name in ("a", "b", "c"):
        queue.enqueue("t.x", job_id=name)
    leases = {lease.id: lease for lease in leasing(queue).claim(OWNER, 3, LONG).leases}
    answers = leasing(queue).ack_many([
        ("a", leases["a"].token, '"A"', ()),
        ("b", "stale-token", '"B"', ()),
        ("c", leases["c"].token, '"C"', [{"id": "c-next", "task": "t.next"}]),
    ])
    assert answers == ["ok", "lost", "ok"]
    assert queue.get("a").state == "succeeded" and queue.get("a").fields["result"] == '"A"'
    assert queue.get("b").state == "active" and "result" not in queue.get("b").fields
    assert queue.get("c-next").fields["parent"] == "c"
    assert queue.get("c").history == []  # a compact succeeded record (keep_history)
    assert r.hget(queue.keys.stats, "succeeded") == "2"
    assert leasing(queue).ack_many([("b", leases["b"].token, "null", ())]) == ["ok"]


def test_a_batch_of_acks_lands_in_a_full_redis(queue, r):
    """maxmemory reached (noeviction): the batch leaves `active` first, a write a full
    Redis allows, and the script may go on writing, as a single ack always could."""
    for name in ("a", "b"):
        queue.enqueue("t.x", job_id=name)
    leases = leasing(queue).claim(OWNER, 2, LONG).leases
    r.config_set("maxmemory", max(1, int(r.info("memory")["used_memory"]) // 2))
    try:
        answers = leasing(queue).ack_many([(lease.id, lease.token, "null", ()) for lease in leases])
    finally:
        r.config_set("maxmemory", 0)
    assert answers == ["ok", "ok"]
    assert queue.get("a").state == queue.get("b").state == "succeeded"


def test_claim_respects_max_in_flight(queue):
    queue.enqueue_many({"task": "t.x"} for _ in range(5))
    queue.set_limits(max_in_flight=2)
    first = leasing(queue).claim(OWNER, 5, LONG)
    assert len(first.leases) == 2 and first.held_by_max_in_flight
    held = leasing(queue).claim(OWNER, 5, LONG)
    assert held.leases == [] and held.held_by_max_in_flight
    lease = first.leases[0]
    assert leasing(queue).ack(lease.id, lease.token, "null") == "ok"
    assert len(leasing(queue).claim(OWNER, 5, LONG).leases) == 1
    queue.set_limits(max_in_flight=None)
    assert len(leasing(queue).claim(OWNER, 5, LONG).leases) == 2


def test_claim_respects_rate_limit(queue):
    queue.enqueue_many({"task": "t.x"} for _ in range(3))
    queue.set_limits(rate=(1, 3600))  # one job an hour, burst of one
    first = leasing(queue).claim(OWNER, 3, LONG)
    assert len(first.leases) == 1
    second = leasing(queue).claim(OWNER, 3, LONG)
    assert second.leases == []
    assert 0 < second.rate_wait_ms <= 3_600_001  # ceil of a float division
    queue.set_limits(rate=None)
    assert len(leasing(queue).claim(OWNER, 3, LONG).leases) == 2


# -- extend ------------------------------------------------------------------------------


def test_extend_renews_live_leases_and_reports_lost_ones(queue, r):
    ids = [j.id for j in queue.enqueue_many({"task": "t.x"} for _ in range(5))]
    leases = {lease.id: lease for lease in leasing(queue).claim(OWNER, 5, 1_000).leases}
    live_a, live_b, stale, finished, released = ids
    assert leasing(queue).ack(finished, leases[finished].token, "1") == "ok"
    assert leasing(queue).release(released, leases[released].token) == "ok"
    batch = [(live_a, leases[live_a].token), (live_b, leases[live_b].token),
             (stale, str(int(leases[stale].token) + 1000)),
             (finished, leases[finished].token), (released, leases[released].token),
             ("no-such-job", "1")]
    lost, cancelled, now = leasing(queue).extend(batch, 45_000)
    assert sorted(lost) == sorted([stale, finished, released, "no-such-job"])
    assert cancelled == []
    assert abs(now - redis_ms(r)) < 5_000
    for jid in (live_a, live_b):
        f = queue.get(jid).fields
        assert f["lease_deadline"] == now + 45_000
        assert r.zscore(queue.keys.active, jid) == now + 45_000
        assert f["token"] == leases[jid].token
    # the stale-token job keeps its original, shorter lease
    assert queue.get(stale).fields["lease_deadline"] < now + 45_000
    assert r.zscore(queue.keys.active, finished) is None
    assert r.zscore(queue.keys.active, "no-such-job") is None


def test_extend_reports_cancel_requests(queue):
    a, b = (j.id for j in queue.enqueue_many([{"task": "t.x"}, {"task": "t.x"}]))
    leases = {lease.id: lease for lease in leasing(queue).claim(OWNER, 2, LONG).leases}
    assert queue.cancel(a) == "cancelling"
    lost, cancelled, _ = leasing(queue).extend([(a, leases[a].token), (b, leases[b].token)], LONG)
    assert lost == [] and cancelled == [a]
    assert queue.get(a).state == "active"


def test_extend_through_a_pipeline(queue):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue)
    pipe = queue.redis.pipeline(transaction=False)
    leasing(queue).extend([(jid, lease.token)], LONG, client=pipe)
    leasing(queue).extend([(jid, "0")], LONG, client=pipe)
    first, second = (LeaseCalls.parse_extend(reply) for reply in pipe.execute())
    assert first[0] == [] and second[0] == [jid]


# -- ack ---------------------------------------------------------------------------------


def test_ack_stores_result_and_succeeds(queue, r):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue)
    assert leasing(queue).ack(jid, lease.token, json.dumps({"sent": 3})) == "ok"
    job = queue.get(jid)
    assert job.state == "succeeded"
    assert job.result == {"sent": 3}
    assert job.attempts == 1
    assert "owner" not in job.fields and "token" not in job.fields
    assert "lease_deadline" not in job.fields
    assert job.fields["finished_at"] >= job.fields["started_at"]
    assert where(queue, jid) == []
    assert job.history == [] and "args" not in job.fields  # compact: no keep_history
    # kept for keep_succeeded (1 h by default), trimmed by the reaper: not forever
    assert r.zscore(queue.keys.kept_bucket("succeeded:10000"), jid) == (
        job.fields["finished_at"] + 3_600_000)


def test_ack_with_stale_token_is_lost_and_changes_nothing(queue, r):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue)
    before = raw(queue, jid)
    assert leasing(queue).ack(jid, str(int(lease.token) + 1), "1") == "lost"
    assert leasing(queue).ack(jid, "", "1") == "lost"
    assert leasing(queue).ack("no-such-job", lease.token, "1") == "lost"
    assert raw(queue, jid) == before
    assert where(queue, jid) == ["active"]
    # and once finished, the right token is stale too
    assert leasing(queue).ack(jid, lease.token, "1") == "ok"
    done = raw(queue, jid)
    assert leasing(queue).ack(jid, lease.token, "2") == "lost"
    assert raw(queue, jid) == done


def test_ack_with_result_ttl_zero_deletes_the_record(queue, r):
    jid = queue.enqueue("t.x", result_ttl=0).id
    lease = claim_one(queue)
    assert leasing(queue).ack(jid, lease.token, "1") == "ok"
    assert not r.exists(queue.keys.job(jid), queue.keys.history(jid))
    with pytest.raises(JobNotFound):
        queue.get(jid)
    assert where(queue, jid) == []
    assert queue.stats()["totals"]["succeeded"] == 1


def test_ack_with_result_ttl_caps_the_keep(queue, r):
    jid = queue.enqueue("t.x", result_ttl="10s").id
    lease = claim_one(queue)
    assert leasing(queue).ack(jid, lease.token, "1") == "ok"
    finished = int(r.hget(queue.keys.job(jid), "finished_at"))
    # the reaper's trim deletes it after 10 s (docs/operations/retention.md), not a key expiry
    assert r.zscore(queue.keys.kept_bucket("succeeded:10000"), jid) == finished + 10_000
    assert not r.exists(queue.keys.history(jid))  # a compact record: no history kept


def test_ack_enqueues_followups_atomically(queue):
    jid = queue.enqueue("t.parent").id
    lease = claim_one(queue)
    follow = [{"id": f"{jid}-1", "task": "t.child", "args": "[1]", "priority": 0},
              {"id": f"{jid}-2", "task": "t.child", "args": "[2]", "delay_ms": 3_600_000}]
    assert leasing(queue).ack(jid, lease.token, "1", followups=follow) == "ok"
    child1 = queue.get(f"{jid}-1")
    child2 = queue.get(f"{jid}-2")
    assert child1.state == "pending" and child1.fields["parent"] == jid
    assert child2.state == "scheduled" and child2.args == [2]
    assert child1.history[0]["parent"] == jid


# -- fail --------------------------------------------------------------------------------


def _backoff_bounds(base: int, factor: float, cap: int, jitter: float, n: int) -> tuple[int, int]:
    delay = min(cap, base * factor ** (n - 1))
    return int(delay * (1 - jitter)) - 1, int(delay * (1 + jitter)) + 1


def test_fail_retries_with_exponential_backoff_then_dead(queue, r):
    base, factor, jitter = 20, 2.0, 0.25
    jid = queue.enqueue("t.flaky", max_attempts=4,
                        backoff={"base": "20ms", "factor": factor, "jitter": jitter}).id
    for n in (1, 2, 3):
        lease = claim_one(queue)
        assert lease.id == jid
        out = leasing(queue).fail(jid, lease.token, {"type": "IOError", "message": f"boom {n}"})
        assert out.outcome == "retry" and out.attempts == n
        job = queue.get(jid)
        assert job.state == "scheduled"
        assert where(queue, jid) == ["scheduled"]
        assert job.fields["run_at"] == out.run_at_ms
        assert r.zscore(queue.keys.scheduled, jid) == out.run_at_ms
        delay = out.run_at_ms - job.fields["finished_at"]
        low, high = _backoff_bounds(base, factor, 600_000, jitter, n)
        assert low <= delay <= high, (n, delay, low, high)
        assert job.error["message"] == f"boom {n}"
        entry = job.history[-1]
        assert entry["event"] == "retry" and entry["attempts"] == n
        assert entry["reason"] == f"boom {n}" and entry["run_at"] == out.run_at_ms
        assert "token" not in job.fields
        wait_redis_past(r, out.run_at_ms)
    lease = claim_one(queue)
    out = leasing(queue).fail(jid, lease.token, {"message": "boom 4"})
    assert (out.outcome, out.attempts) == ("dead", 4)
    job = queue.get(jid)
    assert job.state == "dead"
    assert where(queue, jid) == ["dead"]
    assert job.reason == "boom 4 (attempts exhausted: 4)"
    assert events(job)[-1] == "dead"
    assert r.pttl(queue.keys.job(jid)) == -1  # dead jobs wait for an operator
    assert [j.id for j in queue.dead()] == [jid]


def test_fail_backoff_jitter_stays_in_bounds(queue):
    jitter = 0.5
    ids = [j.id for j in queue.enqueue_many(
        {"task": "t.x", "backoff": {"base": "10s", "factor": 2, "jitter": jitter}}
        for _ in range(25))]
    delays = []
    for lease in leasing(queue).claim(OWNER, 25, LONG).leases:
        out = leasing(queue).fail(lease.id, lease.token, {"message": "x"})
        assert out.outcome == "retry"
        delays.append(out.run_at_ms - queue.get(lease.id).fields["finished_at"])
    assert len(delays) == len(ids)
    low, high = _backoff_bounds(10_000, 2, 600_000, jitter, 1)
    assert all(low <= d <= high for d in delays), delays
    assert len(set(delays)) > 5  # the jitter really varies


def test_fail_backoff_is_capped(queue):
    jid = queue.enqueue("t.x", backoff={"base": "5s", "max": "2s", "jitter": 0}).id
    lease = claim_one(queue)
    out = leasing(queue).fail(jid, lease.token, {"message": "x"})
    assert out.run_at_ms - queue.get(jid).fields["finished_at"] == 2_000
    # not claimable before its backoff is over, and the claim says when it will be
    result = leasing(queue).claim(OWNER, 1, LONG)
    assert result.leases == [] and result.next_due_ms == out.run_at_ms


def test_fail_fatal_is_dead_at_once(queue):
    jid = queue.enqueue("t.x", max_attempts=10).id
    lease = claim_one(queue)
    out = leasing(queue).fail(jid, lease.token, {"message": "unknown task t.x", "reason": "unknown task"},
                     mode="fatal")
    assert (out.outcome, out.attempts) == ("dead", 1)
    job = queue.get(jid)
    assert job.state == "dead" and job.reason == "unknown task"
    assert where(queue, jid) == ["dead"]


def test_fail_cancel_mode_cancels(queue, r):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue)
    assert queue.cancel(jid) == "cancelling"
    assert queue.get(jid).fields.get("cancel_requested")
    out = leasing(queue).fail(jid, lease.token, {"message": "cancelled by operator"}, mode="cancel")
    assert out.outcome == "cancelled"
    job = queue.get(jid)
    assert job.state == "cancelled"
    assert "cancel_requested" not in job.fields
    assert where(queue, jid) == []
    assert events(job)[-2:] == ["cancel requested", "cancelled"]
    assert queue.cancel(jid) == "cancelled"


def test_fail_with_stale_token_is_lost(queue):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue)
    before = raw(queue, jid)
    out = leasing(queue).fail(jid, "999999999", {"message": "x"})
    assert (out.outcome, out.run_at_ms, out.attempts) == ("lost", 0, 0)
    assert leasing(queue).fail("no-such-job", lease.token, {"message": "x"}).outcome == "lost"
    assert raw(queue, jid) == before
    assert where(queue, jid) == ["active"]


# -- expire and reclaim ---------------------------------------------------------------------


def test_expire_then_reclaim_returns_job_to_its_place(queue, r):
    a, b, c = (j.id for j in queue.enqueue_many({"task": "t.x"} for _ in range(3)))
    lease = claim_one(queue)
    assert lease.id == a
    assert leasing(queue).expire(a, lease.token, "killed by SIGSEGV (peak RSS 41.2MiB)") == "ok"
    f = queue.get(a).fields
    assert f["lease_deadline"] == 0 and f["last_crash"].startswith("killed by SIGSEGV")
    assert r.zscore(queue.keys.active, a) == 0
    assert events(queue.get(a))[-1] == "crashed"
    moved = leasing(queue).reclaim("reaper-1")
    assert moved == (1, 0, 0, [a])
    job = queue.get(a)
    assert job.state == "pending" and job.crashes == 1 and job.attempts == 0
    assert "token" not in job.fields and "owner" not in job.fields
    assert "last_crash" not in job.fields
    assert where(queue, a) == ["pending"]
    entry = job.history[-1]
    assert entry["event"] == "reclaimed" and entry["by"] == "reaper-1"
    assert entry["reason"] == "killed by SIGSEGV (peak RSS 41.2MiB)"
    assert entry["owner"] == OWNER and entry["crashes"] == 1
    # back at the head of the line, ahead of the jobs enqueued after it
    assert [lease.id for lease in leasing(queue).claim(OWNER, 3, LONG).leases] == [a, b, c]
    # the old token is dead
    assert leasing(queue).ack(a, lease.token, "1") == "lost"


def test_expire_with_stale_token_is_lost(queue):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue)
    before = raw(queue, jid)
    assert leasing(queue).expire(jid, lease.token + "0", "x") == "lost"
    assert leasing(queue).expire("no-such-job", lease.token, "x") == "lost"
    assert raw(queue, jid) == before


def test_crashes_past_max_go_dead_with_the_last_reason(queue):
    jid = queue.enqueue("t.poison", max_crashes=3).id
    for n in (1, 2):
        lease = claim_one(queue)
        assert leasing(queue).expire(jid, lease.token, f"killed by signal {n}") == "ok"
        assert leasing(queue).reclaim("reaper") == (1, 0, 0, [jid])
        assert queue.get(jid).crashes == n
    lease = claim_one(queue)
    assert leasing(queue).expire(jid, lease.token, "exit code 137 (OOM)") == "ok"
    assert leasing(queue).reclaim("reaper") == (0, 1, 0, [jid])
    job = queue.get(jid)
    assert job.state == "dead" and job.crashes == 3
    assert job.reason == "exit code 137 (OOM) (crashes exhausted: 3)"
    assert where(queue, jid) == ["dead"]
    assert "token" not in job.fields
    assert events(job).count("claimed") == 3 and events(job).count("crashed") == 3


def test_reclaim_default_max_crashes_applies_when_job_has_none(queue):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue)
    leasing(queue).expire(jid, lease.token, "boom")
    assert leasing(queue).reclaim("reaper", default_max_crashes=1) == (0, 1, 0, [jid])
    assert queue.get(jid).state == "dead"


def test_reclaim_leaves_unexpired_leases_alone(queue):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue, ttl=LONG)
    before = raw(queue, jid)
    assert leasing(queue).reclaim("reaper") == (0, 0, 0, [])
    assert raw(queue, jid) == before
    assert leasing(queue).ack(jid, lease.token, "1") == "ok"


def test_reclaim_takes_a_lease_expired_by_its_deadline(queue, r):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue, ttl=5)
    wait_redis_past(r, queue.get(jid).fields["lease_deadline"])
    assert leasing(queue).reclaim("reaper") == (1, 0, 0, [jid])
    job = queue.get(jid)
    assert job.state == "pending" and job.crashes == 1
    assert job.history[-1]["reason"] == f"lease expired (owner {OWNER})"
    assert leasing(queue).extend([(jid, lease.token)], LONG)[0] == [jid]


def test_reclaim_respects_its_limit(queue, r):
    queue.enqueue_many({"task": "t.x"} for _ in range(5))
    leases = leasing(queue).claim(OWNER, 5, 1).leases
    wait_redis_past(r, max(lease.job.fields["lease_deadline"] for lease in leases))
    first = leasing(queue).reclaim("reaper", limit=2)
    assert first[0] == 2 and len(first[3]) == 2
    rest = leasing(queue).reclaim("reaper", limit=10)
    assert rest[0] == 3 and set(first[3]).isdisjoint(rest[3])
    assert r.zcard(queue.keys.active) == 0 and r.zcard(queue.keys.pending) == 5


# -- release -----------------------------------------------------------------------------


def test_release_returns_to_pending_without_counting(queue):
    a, b = (j.id for j in queue.enqueue_many([{"task": "t.x"}, {"task": "t.x"}]))
    lease = claim_one(queue)
    assert leasing(queue).release(a, lease.token, "drain") == "ok"
    job = queue.get(a)
    assert job.state == "pending" and job.attempts == 0 and job.crashes == 0
    assert "token" not in job.fields and "owner" not in job.fields
    assert where(queue, a) == ["pending"]
    assert job.history[-1]["event"] == "released"
    assert job.history[-1]["reason"] == "drain" and job.history[-1]["owner"] == OWNER
    assert [lease.id for lease in leasing(queue).claim(OWNER, 2, LONG).leases] == [a, b]
    stats = queue.stats()["totals"]
    assert "crashed" not in stats and "failed" not in stats


def test_release_with_stale_token_is_lost(queue):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue)
    before = raw(queue, jid)
    assert leasing(queue).release(jid, "nope") == "lost"
    assert raw(queue, jid) == before
    assert leasing(queue).release(jid, lease.token) == "ok"
    assert leasing(queue).release(jid, lease.token) == "lost"


# -- cancel ------------------------------------------------------------------------------


def test_cancel_in_every_state(queue):
    pending = queue.enqueue("t.x").id
    scheduled = queue.enqueue("t.x", delay="1h").id
    active = queue.enqueue("t.x").id
    succeeded = queue.enqueue("t.x").id
    dead = queue.enqueue("t.x").id
    assert queue.cancel(pending) == "cancelled"
    assert queue.cancel(scheduled) == "cancelled"
    leases = {lease.id: lease for lease in leasing(queue).claim(OWNER, 10, LONG).leases}
    assert set(leases) == {active, succeeded, dead}
    assert leasing(queue).ack(succeeded, leases[succeeded].token, "1") == "ok"
    assert leasing(queue).fail(dead, leases[dead].token, {"message": "x"}, mode="fatal").outcome == "dead"
    for jid in (pending, scheduled):
        job = queue.get(jid)
        assert job.state == "cancelled" and where(queue, jid) == []
        assert events(job)[-1] == "cancelled"
        assert "finished_at" in job.fields
    assert queue.cancel(active) == "cancelling"
    assert queue.get(active).state == "active"
    assert where(queue, active) == ["active"]
    assert queue.cancel(succeeded) == "succeeded"
    assert queue.cancel(dead) == "dead"
    assert queue.cancel(pending) == "cancelled"
    assert queue.cancel("no-such-job") == "missing"
    assert queue.stats()["totals"]["cancelled"] == 2


def test_cancel_frees_the_idempotency_key(queue):
    first = queue.enqueue("t.x", key="order-1").id
    assert queue.cancel(first) == "cancelled"
    second = queue.enqueue("t.x", key="order-1")
    assert second.id != first and second.fields["enqueue_status"] == "pending"


# -- dead-letter tools -------------------------------------------------------------------


def _make_dead(queue: Queue, n: int) -> list[str]:
    ids = [j.id for j in queue.enqueue_many({"task": "t.x", "args": [i]} for i in range(n))]
    for lease in leasing(queue).claim(OWNER, n, LONG).leases:
        assert leasing(queue).fail(lease.id, lease.token, {"message": "bad"}, mode="fatal").outcome == "dead"
    return ids


def test_requeue_dead_by_ids(queue):
    a, b, c = _make_dead(queue, 3)
    live = queue.enqueue("t.x").id
    count, missing = queue.requeue_dead([a, c, "no-such-job", live])
    assert count == 2 and missing == ["no-such-job", live]
    for jid in (a, c):
        job = queue.get(jid)
        assert job.state == "pending" and job.attempts == 0 and job.crashes == 0
        assert "dead_reason" not in job.fields
        assert where(queue, jid) == ["pending"]
        assert events(job)[-1] == "requeued"
    assert queue.get(b).state == "dead"
    assert queue.get(live).state == "pending"
    claimed = {lease.id for lease in leasing(queue).claim(OWNER, 10, LONG).leases}
    assert claimed == {a, c, live}


def test_requeue_dead_all(queue):
    ids = _make_dead(queue, 4)
    assert queue.requeue_dead() == (4, [])
    assert all(queue.get(jid).state == "pending" for jid in ids)
    assert queue.redis.zcard(queue.keys.dead) == 0
    assert queue.requeue_dead() == (0, [])


def test_requeue_dead_all_respects_limit(queue):
    _make_dead(queue, 5)
    assert queue.requeue_dead(limit=2) == (2, [])
    assert queue.redis.zcard(queue.keys.dead) == 3


def test_purge_dead_by_ids_and_all(queue, r):
    a, b, c = _make_dead(queue, 3)
    live = queue.enqueue("t.x").id
    assert queue.purge_dead([b, "no-such-job", live]) == (1, ["no-such-job", live])
    assert not r.exists(queue.keys.job(b), queue.keys.history(b))
    with pytest.raises(JobNotFound):
        queue.get(b)
    assert queue.get(live).state == "pending"
    assert queue.purge_dead() == (2, [])
    for jid in (a, c):
        assert not r.exists(queue.keys.job(jid))
    assert r.zcard(queue.keys.dead) == 0


# -- idempotency keys ----------------------------------------------------------------------


def test_idempotency_key_while_live_returns_the_first_job(queue, r):
    first = queue.enqueue("t.x", 1, key="invoice-42")
    dup = queue.enqueue("t.x", 2, key="invoice-42")
    assert dup.id == first.id and dup.fields["enqueue_status"] == "duplicate"
    assert r.zcard(queue.keys.pending) == 1
    assert queue.get(first.id).args == [1]
    # still a duplicate while active
    lease = claim_one(queue)
    assert queue.enqueue("t.x", key="invoice-42").id == first.id
    many = queue.enqueue_many([{"task": "t.x", "key": "invoice-42"}, {"task": "t.x"}])
    assert many[0].id == first.id and many[0].fields["enqueue_status"] == "duplicate"
    assert many[1].fields["enqueue_status"] == "pending"
    assert r.zcard(queue.keys.pending) == 1  # only the unkeyed one
    assert queue.stats()["totals"]["enqueued"] == 2
    # once finished, the key is free again
    assert leasing(queue).ack(first.id, lease.token, "1") == "ok"
    again = queue.enqueue("t.x", 3, key="invoice-42")
    assert again.id != first.id and again.fields["enqueue_status"] == "pending"
    assert queue.get(again.id).args == [3]


def test_idempotency_key_freed_when_job_dies(queue):
    first = queue.enqueue("t.x", key="k")
    lease = claim_one(queue)
    leasing(queue).fail(first.id, lease.token, {"message": "x"}, mode="fatal")
    assert queue.enqueue("t.x", key="k").id != first.id


def test_unique_for_keeps_the_key_after_finishing(queue, r):
    first = queue.enqueue("t.x", key="daily-report", unique_for="1h")
    lease = claim_one(queue)
    assert leasing(queue).ack(first.id, lease.token, "1") == "ok"
    dup = queue.enqueue("t.x", key="daily-report", unique_for="1h")
    assert dup.id == first.id and dup.fields["enqueue_status"] == "duplicate"
    ukey = queue.keys.prefix + "unique:daily-report"
    assert 0 < r.pttl(ukey) <= 3_600_000


def test_unique_for_expired_frees_the_key(queue, r):
    first = queue.enqueue("t.x", key="short", unique_for="20ms")
    lease = claim_one(queue)
    wait_redis_past(r, queue.get(first.id).fields["enqueued_at"] + 20)
    assert leasing(queue).ack(first.id, lease.token, "1") == "ok"
    assert queue.enqueue("t.x", key="short").id != first.id


# -- effectively-once completion -------------------------------------------------------------


def test_record_done_then_reclaim_succeeds_without_rerun(queue, r):
    jid = queue.enqueue("t.charge", idempotent=True, keep_history=True).id
    lease = claim_one(queue)
    leasing(queue).record_done(jid, json.dumps({"charged": 10}), 60_000)
    assert 0 < r.pttl(queue.keys.done(jid)) <= 60_000
    # the ack is lost: the supervisor died. Its lease expires and is reclaimed.
    assert leasing(queue).expire(jid, lease.token, "supervisor died") == "ok"
    assert leasing(queue).reclaim("reaper") == (0, 0, 1, [jid])
    job = queue.get(jid)
    assert job.state == "succeeded" and job.result == {"charged": 10}
    assert job.crashes == 0 and job.attempts == 1
    assert job.history[-1]["event"] == "succeeded"
    assert job.history[-1]["source"] == "completion recorded before"
    assert where(queue, jid) == []
    assert leasing(queue).claim(OWNER, 10, LONG).leases == []


def test_record_done_then_claim_succeeds_without_rerun(queue):
    jid = queue.enqueue("t.charge", idempotent=True).id
    lease = claim_one(queue)
    leasing(queue).record_done(jid, '"done"', 60_000)
    assert leasing(queue).release(jid, lease.token) == "ok"
    assert leasing(queue).claim(OWNER, 10, LONG).leases == []
    job = queue.get(jid)
    assert job.state == "succeeded" and job.result == "done"


# -- stats and history -----------------------------------------------------------------------


def test_stats_counts(queue):
    ids = [j.id for j in queue.enqueue_many({"task": "t.x"} for _ in range(5))]
    queue.enqueue("t.x", delay="1h")
    empty = Queue(queue.name + "x", redis=queue.redis).stats()
    assert empty["pending"] == 0 and empty["oldest_pending_age"] is None
    leases = {lease.id: lease for lease in leasing(queue).claim(OWNER, 3, LONG).leases}
    ok, dead, crash = ids[:3]
    assert leasing(queue).ack(ok, leases[ok].token, "1") == "ok"
    leasing(queue).fail(dead, leases[dead].token, {"message": "x"}, mode="fatal")
    leasing(queue).expire(crash, leases[crash].token, "segv")
    leasing(queue).reclaim("reaper")
    retry = claim_one(queue)
    assert retry.id == crash
    assert leasing(queue).fail(crash, retry.token, {"message": "y"}).outcome == "retry"
    active = claim_one(queue)
    stats = queue.stats()
    assert stats["pending"] == 1
    assert stats["scheduled"] == 2
    assert stats["active"] == 1
    assert stats["dead"] == 1
    assert stats["succeeded"] == 1
    assert stats["failed"] == 2
    assert stats["totals"]["enqueued"] == 6
    assert stats["totals"]["crashed"] == 1
    assert stats["totals"]["retried"] == 1
    assert stats["totals"]["dead"] == 1
    assert stats["last_minute"]["succeeded"] == 1
    assert stats["last_minute"]["dead"] == 1
    assert stats["oldest_pending_age"] is not None and 0 <= stats["oldest_pending_age"] < 60
    assert active.id not in (ok, dead, crash)


def test_every_history_entry_has_event_and_time_in_seconds(queue, r):
    jid = queue.enqueue("t.x", max_attempts=3, backoff={"base": "1ms", "jitter": 0}).id
    lease = claim_one(queue)
    leasing(queue).release(jid, lease.token)
    lease = claim_one(queue)
    leasing(queue).expire(jid, lease.token, "segv")
    leasing(queue).reclaim("reaper")
    lease = claim_one(queue)
    out = leasing(queue).fail(jid, lease.token, {"message": "x"})
    wait_redis_past(r, out.run_at_ms)
    lease = claim_one(queue)
    queue.cancel(jid)
    leasing(queue).fail(jid, lease.token, {"message": "stop"}, mode="cancel")
    job = queue.get(jid)
    assert events(job) == ["enqueued", "claimed", "released", "claimed", "crashed",
                           "reclaimed", "claimed", "retry", "claimed", "cancel requested",
                           "cancelled"]
    now = time.time()
    previous = 0.0
    for entry in job.history:
        assert isinstance(entry["event"], str) and entry["event"]
        assert isinstance(entry["at"], float)
        assert now - 120 < entry["at"] < now + 120  # seconds, not milliseconds
        assert entry["at"] >= previous
        previous = entry["at"]


def test_history_is_capped(queue):
    jid = queue.enqueue("t.x").id
    for _ in range(60):
        lease = claim_one(queue)
        assert leasing(queue).release(jid, lease.token) == "ok"
    history = queue.get(jid).history
    assert len(history) == 100
    assert history[0]["event"] != "enqueued" and history[-1]["event"] == "released"


# -- payload refusals ------------------------------------------------------------------------


def test_refuses_a_set_argument_naming_it(queue, r):
    with pytest.raises(PayloadError, match=r"args\[0\]"):
        queue.enqueue("t.x", {1, 2})
    assert r.zcard(queue.keys.pending) == 0


def test_refuses_an_unserialisable_kwarg_naming_it(queue, r):
    with pytest.raises(PayloadError, match=r"kwargs\['x'\]"):
        queue.enqueue("t.x", kwargs={"ok": 1, "x": object()})
    with pytest.raises(PayloadError, match=r"args\[1\]"):
        queue.enqueue("t.x", 1, float("nan"))
    assert r.zcard(queue.keys.pending) == 0


def test_refuses_an_oversized_payload_naming_the_largest_argument(r, queue_name):
    q = Queue(queue_name, redis=r, max_payload_bytes=1000)
    with pytest.raises(PayloadError) as info:
        q.enqueue("t.x", "small", kwargs={"blob": "x" * 2000, "tiny": 1})
    message = str(info.value)
    assert "kwargs['blob']" in message and "1000" in message
    assert r.zcard(q.keys.pending) == 0
    q.enqueue("t.x", "x" * 500)  # under the limit is fine
    assert r.zcard(q.keys.pending) == 1


@pytest.mark.parametrize("priority", [1.5, "high", True, 1001, -1001, None])
def test_refuses_a_bad_priority(queue, priority):
    with pytest.raises(PayloadError, match="priority"):
        queue.enqueue("t.x", priority=priority)
    assert queue.redis.zcard(queue.keys.pending) == 0


def test_refuses_an_unknown_option(queue):
    with pytest.raises(PayloadError, match="colour"):
        queue.enqueue("t.x", colour="red")
    with pytest.raises(PayloadError, match="task name"):
        queue.enqueue("", 1)
    with pytest.raises(PayloadError, match="max_attempts"):
        queue.enqueue("t.x", max_attempts=0)
    assert queue.redis.zcard(queue.keys.pending) == 0


@pytest.mark.parametrize("options, named", [
    ({"backoff": {"bas": "1s"}}, "backoff has unknown key(s) bas"),
    ({"backoff": {"factor": "x"}}, "backoff.factor must be a number"),
    ({"backoff": {"factor": 0.5}}, "backoff.factor must be at least 1"),
    ({"backoff": {"jitter": 5}}, "backoff.jitter must be from 0 to 1"),
    ({"backoff": ["1s"]}, "backoff must be a mapping"),
    ({"timeout": 0}, "timeout must be more than 0"),
    ({"timeout": "5x"}, "timeout: expected a duration"),
    ({"max_attempts": True}, "max_attempts must be an integer"),
    ({"max_crashes": -1}, "max_crashes must be at least 0"),
    ({"max_result_bytes": 0}, "max_result_bytes must be at least 1"),
    ({"memory_limit": "lots"}, "memory_limit"),
])
def test_refuses_a_policy_option_outside_what_a_config_allows(queue, options, named):
    """Per-job options are the config's policy rows (forq.defaults): the same bounds, a
    PayloadError naming the option, nothing enqueued."""
    with pytest.raises(PayloadError) as info:
        queue.enqueue("t.x", **options)
    assert named in str(info.value) and "'t.x'" in str(info.value)
    assert queue.redis.zcard(queue.keys.pending) == 0


def test_enqueue_many_refuses_the_whole_batch(queue, r):
    jobs = [{"task": "t.x", "args": [i]} for i in range(10)]
    jobs[6]["args"] = [{1}]
    with pytest.raises(PayloadError, match=r"jobs\[6\].*args\[0\]"):
        queue.enqueue_many(jobs)
    assert r.zcard(queue.keys.pending) == 0


# -- enqueue_many, lookup, scripts ----------------------------------------------------------


def test_enqueue_many_beyond_one_script_batch_keeps_order(queue, r):
    n = 1200
    handles = queue.enqueue_many({"task": "t.bulk", "args": [i]} for i in range(n))
    assert len(handles) == n
    assert all(h.fields["enqueue_status"] == "pending" for h in handles)
    assert len({h.id for h in handles}) == n
    assert r.zcard(queue.keys.pending) == n
    pipe = r.pipeline(transaction=False)
    for h in handles:
        pipe.hget(queue.keys.job(h.id), "args")
    assert [json.loads(a) for a in pipe.execute()] == [[i] for i in range(n)]
    claimed = []
    while True:
        leases = leasing(queue).claim(OWNER, 500, LONG).leases
        if not leases:
            break
        claimed += [lease.id for lease in leases]
    assert claimed == [h.id for h in handles]


def test_enqueue_many_mixes_plain_jobs_and_jobs_with_options(queue, r):
    """A plain job (task, arguments, priority, job_id) takes the enqueue script's short
    path, any other the general one (lua/enqueue.lua): in one call they keep their
    order and their own outcomes, and write the same record, history and event."""
    queue.enqueue("t.first", job_id="taken")
    jobs = [{"task": "t.plain", "args": [0]},
            {"task": "t.opts", "args": [1], "max_attempts": 3},
            {"task": "t.plain", "args": [2], "job_id": "taken"},  # short path, duplicate
            {"task": "t.opts", "args": [3], "job_id": "taken", "timeout": 5},  # general
            {"task": "t.plain", "args": [4], "priority": 1000},
            {"task": "t.later", "args": [5], "delay": "1h"},
            {"task": "t.plain", "args": [6], "priority": -1000}]
    handles = queue.enqueue_many(jobs)
    assert [h.fields["enqueue_status"] for h in handles] == [
        "pending", "pending", "duplicate", "duplicate", "pending", "scheduled", "pending"]
    assert handles[2].id == handles[3].id == "taken"
    plain, general = (r.hgetall(queue.keys.job(handles[i].id)) for i in (0, 1))
    assert set(general) - set(plain) == {"max_attempts"} and set(plain) <= set(general)
    assert {k: plain[k] for k in ("state", "priority", "attempts", "crashes", "args")} == {
        "state": "pending", "priority": "0", "attempts": "0", "crashes": "0", "args": "[0]"}
    assert plain["enqueued_at"] == plain["run_at"] == general["enqueued_at"]
    # a priority's score is written exactly (2^42 per step: beyond Lua's %.14g)
    for h, priority in ((handles[4], 1000), (handles[6], -1000)):
        score = int(r.hget(queue.keys.job(h.id), "score"))
        assert score == r.zscore(queue.keys.pending, h.id)
        assert 0 < score + priority * 2**42 < 2**41
    for h in handles[:2]:
        assert [e["event"] for e in queue.get(h.id).history] == ["enqueued"]
    events = [(f["id"], f["state"]) for _, f in r.xrange(queue.keys.events)
              if f["event"] == "enqueued"]
    assert events == [("taken", "pending")] + [
        (handles[i].id, "scheduled" if i == 5 else "pending") for i in (0, 1, 4, 5, 6)]
    claimed = []
    while leases := leasing(queue).claim(OWNER, 10, LONG).leases:
        claimed += [lease.id for lease in leases]
    # by priority, then in the order of the enqueues, whichever path wrote them
    assert claimed == [handles[4].id, "taken", handles[0].id, handles[1].id, handles[6].id]


def test_find_job_across_queues(r, queue, other_queue):
    mine = queue.enqueue("t.a").id
    theirs = other_queue.enqueue("t.b").id
    found = find_job(r, theirs)
    assert found.queue == other_queue.name and found.task == "t.b"
    found = find_job(r, mine)
    assert found.queue == queue.name and found.task == "t.a"
    with pytest.raises(JobNotFound):
        find_job(r, "no-such-job-" + uuid.uuid4().hex)


def test_get_unknown_job_raises(queue):
    with pytest.raises(JobNotFound, match="no-such-job"):
        queue.get("no-such-job")


def test_scripts_reload_after_script_flush():
    """NOSCRIPT path: a private Redis, so flushing scripts cannot disturb other tests."""
    with RedisServer() as server:
        q = Queue("noscript", url=server.url)
        assert q.enqueue("t.x", 1).fields["enqueue_status"] == "pending"
        q.redis.script_flush()
        assert q.redis.script_exists(q.scripts.enqueue.sha) == [False]
        # through a pipeline (enqueue) and a direct EVALSHA (claim, ack)
        assert q.enqueue("t.x", 2).fields["enqueue_status"] == "pending"
        assert q.redis.script_exists(q.scripts.enqueue.sha) == [True]
        leases = leasing(q).claim(OWNER, 5, LONG).leases
        assert [lease.job.args for lease in leases] == [[1], [2]]
        q.redis.script_flush()
        assert leasing(q).ack(leases[0].id, leases[0].token, "1") == "ok"
        pipe = q.redis.pipeline(transaction=False)
        q.redis.script_flush()
        leasing(q).ack(leases[1].id, leases[1].token, "2", client=pipe)
        assert pipe.execute() == ["ok"]
        assert q.get(leases[1].id).state == "succeeded"


def test_record_done_followups_are_enqueued_when_found_done(queue):
    jid = queue.enqueue("t.charge", idempotent=True).id
    lease = claim_one(queue)
    follow = [{"id": f"{jid}-1", "task": "t.receipt", "args": "[1]", "priority": 0}]
    leasing(queue).record_done(jid, '"charged"', 60_000, followups=follow)
    assert leasing(queue).expire(jid, lease.token, "supervisor died") == "ok"
    assert leasing(queue).reclaim("reaper") == (0, 0, 1, [jid])
    assert queue.get(jid).state == "succeeded"
    child = queue.get(f"{jid}-1")
    assert child.state == "pending" and child.fields["parent"] == jid
    assert [lease.id for lease in leasing(queue).claim(OWNER, 10, LONG).leases] == [f"{jid}-1"]


# -- a requested cancel is never undone ----------------------------------------------------


def test_cancel_requested_then_lease_expires_is_cancelled_not_rerun(queue, r):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue, ttl=5)
    assert queue.cancel(jid) == "cancelling"
    # the supervisor died before its next extend could tell it: the lease runs out
    wait_redis_past(r, queue.get(jid).fields["lease_deadline"])
    moved = leasing(queue).reclaim("reaper")
    assert moved[3] == [jid]
    job = queue.get(jid)
    assert job.state == "cancelled", job.state
    assert where(queue, jid) == []
    assert job.history[-1]["event"] == "cancelled" and job.crashes == 0
    assert queue.stats()["totals"]["cancelled"] == 1
    assert leasing(queue).claim(OWNER, 10, LONG).leases == []
    assert leasing(queue).ack(jid, lease.token, "1") == "lost"


def test_cancel_requested_then_released_is_cancelled(queue):
    jid = queue.enqueue("t.x").id
    lease = claim_one(queue)
    assert queue.cancel(jid) == "cancelling"
    assert leasing(queue).release(jid, lease.token, "drain") == "ok"
    assert queue.get(jid).state == "cancelled"
    assert where(queue, jid) == []
    assert leasing(queue).claim(OWNER, 10, LONG).leases == []


def test_cancel_requested_then_failure_is_cancelled_not_retried(queue):
    jid = queue.enqueue("t.x", max_attempts=5).id
    lease = claim_one(queue)
    assert queue.cancel(jid) == "cancelling"
    out = leasing(queue).fail(jid, lease.token, {"message": "boom"})
    assert out.outcome == "cancelled"
    assert queue.get(jid).state == "cancelled"
    assert where(queue, jid) == []


def test_pipelines_send_scripts_without_asking_script_exists():
    """One round trip per pipeline: no SCRIPT EXISTS before it (counted by Redis)."""
    with RedisServer() as server:
        q = Queue("oneround", url=server.url)
        q.enqueue_many([{"task": "t.x"}] * 3)

        def script_exists_calls() -> int:
            stats = q.redis.info("commandstats")
            return int(stats.get("cmdstat_script|exists", {}).get("calls", 0))

        before = script_exists_calls()
        q.enqueue_many([{"task": "t.x"}] * 3)
        pipe = q.redis.pipeline(transaction=False)
        leasing(q).claim(OWNER, 5, LONG, client=pipe)
        assert len(leasing(q).parse_claim(pipe.execute()[0]).leases) == 5
        assert script_exists_calls() == before
