"""Retention (issue 26 item 1): ended jobs' records are bounded by configuration, not by
history. A succeeded or dead job enters its queue's retention index; the reaper's trim
(lua/trim.lua) deletes records past their keep age or beyond their keep count, a bounded
number per pass, and never a live job or a record someone still needs."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis as redis_lib

from forq import Queue
from forq.errors import PayloadError
from forq.store.control import TrimResult, parse_trim, purge_call, retained_counts, trim_call
from forq.supervisor.config.load import ConfigError, load_config
from forq.supervisor.leases.calls import leasing
from forq.testing.redis import free_port
from tests.helpers import wait_for
from tests.supervisors import REPO, SupervisorProcess, write_config

OWNER = "retention-test:1"
LONG = 60_000
GONE = {"age": "0s"}  # trimmed by the next pass


def trim(queue: Queue, limit: int = 1000) -> TrimResult:
    return parse_trim(queue.scripts.run(trim_call(queue.keys, limit)))


def next_ms(queue: Queue) -> None:
    """Wait for Redis's clock to move on a millisecond: jobs that end in the same one are
    as old as each other, and a count's trim may take either."""
    def ms() -> int:
        seconds, micros = queue.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    now = ms()
    wait_for(lambda: ms() > now, timeout=5, interval=0.0005, message="the next millisecond")


def succeed(queue: Queue, task: str = "t.x", policy: str = "", **options) -> str:
    next_ms(queue)
    jid = queue.enqueue(task, **options).id
    (lease,) = leasing(queue).claim(OWNER, 1, LONG, policy).leases
    assert lease.id == jid
    assert leasing(queue).ack(jid, lease.token, json.dumps({"n": 1})) == "ok"
    return jid


def die(queue: Queue, task: str = "t.x", **options) -> str:
    next_ms(queue)
    jid = queue.enqueue(task, **options).id
    (lease,) = leasing(queue).claim(OWNER, 1, LONG).leases
    assert leasing(queue).fail(jid, lease.token, {"message": "poison"}, "fatal").outcome == "dead"
    return jid


def exists(queue: Queue, jid: str) -> bool:
    return bool(queue.redis.exists(queue.keys.job(jid)))


# -- the record -----------------------------------------------------------------------------


def test_a_succeeded_record_is_compact_and_indexed(queue: Queue, r: redis_lib.Redis):
    jid = succeed(queue, args=["x" * 200])
    fields = r.hgetall(queue.keys.job(jid))
    assert set(fields) <= {"id", "queue", "task", "state", "result", "enqueued_at",
                           "started_at", "finished_at", "attempts", "crashes"}
    assert fields["state"] == "succeeded" and fields["result"] == '{"n": 1}'
    assert not r.exists(queue.keys.history(jid))
    assert r.smembers(queue.keys.kept) == {"succeeded:10000"}
    score = r.zscore(queue.keys.kept_bucket("succeeded:10000"), jid)
    assert score == int(fields["finished_at"]) + 3_600_000  # the default age: 1 h
    assert r.pttl(queue.keys.job(jid)) == -1  # the reaper trims it, no key expiry
    assert retained_counts(r, queue.keys) == {"succeeded": 1, "dead": 0}


def test_forq_job_says_a_compact_records_arguments_were_not_kept(queue: Queue):
    from forq.supervisor.cli import render

    shown = render.job(queue.get(succeed(queue, args=["secret"])))
    assert "args      not kept (keep_history = true keeps them)" in shown, shown
    assert "secret" not in shown
    kept = render.job(queue.get(succeed(queue, args=["x"], keep_history=True)))
    assert 'args      ["x"]' in kept and "kwargs" in kept, kept


def test_keep_history_keeps_the_whole_record(queue: Queue, r: redis_lib.Redis):
    jid = succeed(queue, args=[1, 2], keep_history=True)
    job = queue.get(jid)
    assert job.args == [1, 2] and [e["event"] for e in job.history][-1] == "succeeded"


def test_a_dead_record_is_indexed_for_30_days(queue: Queue, r: redis_lib.Redis):
    jid = die(queue)
    assert queue.get(jid).history  # a dead record keeps its story: it is read
    finished = int(r.hget(queue.keys.job(jid), "finished_at"))
    assert r.zscore(queue.keys.kept_bucket("dead:10000"), jid) == finished + 30 * 86_400_000
    assert trim(queue) == (0, 0, 0, False)
    assert queue.get(jid).state == "dead"


# -- trimming -------------------------------------------------------------------------------


def test_trim_by_age(queue: Queue, r: redis_lib.Redis):
    old = succeed(queue, keep_succeeded=GONE)
    young = succeed(queue)
    dead = die(queue, keep_dead=GONE)
    assert trim(queue) == (1, 1, 0, False)
    assert not exists(queue, old) and not r.exists(queue.keys.history(dead))
    assert not exists(queue, dead) and r.zscore(queue.keys.dead, dead) is None
    assert r.zscore(queue.keys.finished, old) is None
    assert queue.get(young).state == "succeeded"
    assert r.smembers(queue.keys.kept) == {"succeeded:10000"}  # empty buckets go


def test_trim_by_count_keeps_the_newest(queue: Queue):
    ids = [succeed(queue, keep_succeeded={"count": 3}) for _ in range(5)]
    dead = [die(queue, keep_dead={"count": 1}) for _ in range(3)]
    assert trim(queue) == (2, 2, 0, False)
    assert [exists(queue, jid) for jid in ids] == [False, False, True, True, True]
    assert [exists(queue, jid) for jid in dead] == [False, False, True]
    assert queue.stats()["dead"] == 1
    assert trim(queue) == (0, 0, 0, False)


def test_a_pass_is_bounded(queue: Queue):
    ids = [succeed(queue, keep_succeeded=GONE) for _ in range(25)]
    assert trim(queue, limit=10) == (10, 0, 0, True)
    assert trim(queue, limit=10) == (10, 0, 0, True)
    assert trim(queue, limit=10).succeeded == 5
    assert not any(exists(queue, jid) for jid in ids)


def test_count_zero_keeps_none_and_result_ttl_zero_indexes_nothing(queue: Queue, r):
    jid = succeed(queue, keep_succeeded={"count": 0})
    assert trim(queue).succeeded == 1 and not exists(queue, jid)
    succeed(queue, result_ttl=0)
    assert r.scard(queue.keys.kept) == 0


def test_result_ttl_caps_the_keep_age(queue: Queue, r):
    jid = succeed(queue, result_ttl="10s")
    finished = int(r.hget(queue.keys.job(jid), "finished_at"))
    assert r.zscore(queue.keys.kept_bucket("succeeded:10000"), jid) == finished + 10_000


def test_the_lua_keep_defaults_are_forq_defaults():
    import re

    from forq.defaults import JOB_POLICY
    from forq.store.scripts import source

    text = source("ack")
    found = re.search(r"KEEP_DEFAULTS = \{succeeded = \{(\d+), (\d+), (\d+)\}, "
                      r"dead = \{(\d+), (\d+), (\d+)\}\}", text)
    assert found, "retain.lua's KEEP_DEFAULTS"
    assert [int(v) for v in found.groups()] == [
        JOB_POLICY["keep_succeeded_ms"], JOB_POLICY["keep_succeeded_count"],
        JOB_POLICY["keep_history"], JOB_POLICY["keep_dead_ms"], JOB_POLICY["keep_dead_count"],
        JOB_POLICY["keep_history"]]


# -- never a live job -----------------------------------------------------------------------


def test_purge_never_deletes_a_live_job(queue: Queue):
    """Pending, scheduled, active, waiting: whatever an index or a purge names, a record
    whose state is not the one trimmed stays."""
    pending = queue.enqueue("t.p").id
    active = queue.enqueue("t.a").id
    leasing(queue).claim(OWNER, 1, LONG)  # the oldest: `pending` is now active
    scheduled = queue.enqueue("t.s", delay="1h").id
    parent = queue.enqueue("t.parent", delay="1h").id
    waiting = queue.enqueue("t.w", depends_on=[parent]).id
    live = [pending, active, scheduled, parent, waiting]
    targets = [(state, jid) for jid in live for state in ("succeeded", "dead")]
    assert parse_trim(queue.scripts.run(purge_call(queue.keys, targets))) == (0, 0, 0, False)
    assert all(exists(queue, jid) for jid in live)
    assert queue.get(waiting).state == "waiting"


def test_a_requeued_dead_job_is_not_trimmed(queue: Queue, r):
    """A dead job requeued may run again (its durable steps with it): its index entry
    goes, its record stays."""
    jid = die(queue, keep_dead=GONE)
    r.hset(queue.keys.job(jid), "step:charge", '{"n":1,"at":1,"result":7}')
    assert queue.requeue_dead([jid])[0] == 1
    assert trim(queue) == (0, 0, 0, False)
    assert queue.get(jid).state == "pending"
    assert r.hget(queue.keys.job(jid), "step:charge")
    assert r.scard(queue.keys.kept) == 0


def test_an_idempotency_key_within_its_ttl_keeps_its_record(queue: Queue, r):
    jid = succeed(queue, key="order-7", unique_for="1h", keep_succeeded=GONE)
    assert trim(queue) == (0, 0, 1, False)
    assert exists(queue, jid)
    again = queue.enqueue("t.x", key="order-7")
    assert again.id == jid and again.fields["enqueue_status"] == "duplicate"
    # looked at again when the key's hold ends, not at every pass
    until = int(r.hget(queue.keys.job(jid), "unique_until"))
    assert r.zscore(queue.keys.kept_bucket("succeeded:10000"), jid) == until
    assert trim(queue) == (0, 0, 0, False)


def test_a_record_a_waiting_job_needs_stays_until_it_ends(queue: Queue):
    """A parent's result is read by the job that depends on it when that one runs."""
    done = succeed(queue, "t.parent", keep_succeeded=GONE)
    later = queue.enqueue("t.parent2", keep_succeeded=GONE).id
    child = queue.enqueue("t.child", depends_on=[done, later]).id
    (lease,) = leasing(queue).claim(OWNER, 1, LONG).leases
    assert lease.id == later
    assert leasing(queue).ack(later, lease.token, "2") == "ok"  # the child is released now
    bucket = queue.keys.kept_bucket("succeeded:10000")
    assert trim(queue) == (0, 0, 2, False)
    assert exists(queue, done) and exists(queue, later)
    assert queue.redis.zscore(bucket, done) > queue.redis.time()[0] * 1000  # looked at later
    (lease,) = leasing(queue).claim(OWNER, 1, LONG).leases
    assert lease.id == child
    queue.redis.zadd(bucket, {done: 0, later: 0})  # that later is now
    assert trim(queue).kept_back == 2  # it runs: it may still read them
    assert leasing(queue).ack(child, lease.token, "3") == "ok"
    queue.redis.zadd(bucket, {done: 0, later: 0})
    assert trim(queue).succeeded == 2
    assert not exists(queue, done) and not exists(queue, later)


def test_a_batch_members_record_stays_until_its_batchs_callbacks_end(queue: Queue):
    """A batch's callbacks read its members' results (parent_results): a member ended
    past its keep stays while the batch is open and until every callback has ended.
    Chaos's soak (30 s keeps, a backlog) caught callbacks reading trimmed members."""
    batch = queue.batch([{"task": "t.m", "keep_succeeded": GONE},
                         {"task": "t.m", "keep_succeeded": GONE}], on_complete="cb.done")
    first, second = (lease for lease in leasing(queue).claim(OWNER, 2, LONG).leases)
    assert leasing(queue).ack(first.id, first.token, "1") == "ok"
    assert trim(queue) == (0, 0, 1, False)  # the batch is open: its callback may read it
    assert exists(queue, first.id)
    assert leasing(queue).ack(second.id, second.token, "2") == "ok"  # done: on_complete
    bucket = queue.keys.kept_bucket("succeeded:10000")
    queue.redis.zadd(bucket, {first.id: 0, second.id: 0})
    assert trim(queue).kept_back == 2  # its callback is pending
    (callback,) = leasing(queue).claim(OWNER, 1, LONG).leases
    assert callback.id == f"{batch.id}-on_complete"
    queue.redis.zadd(bucket, {first.id: 0, second.id: 0})
    assert trim(queue).kept_back == 2  # running: it may read them now
    assert leasing(queue).ack(callback.id, callback.token, "3") == "ok"
    queue.redis.zadd(bucket, {first.id: 0, second.id: 0})
    assert trim(queue).succeeded == 2
    assert not exists(queue, first.id) and not exists(queue, second.id)


# -- per task and per job -------------------------------------------------------------------


def test_a_tasks_own_keep_comes_from_its_policy(queue: Queue, r):
    policy = json.dumps({"defaults": {"keep_succeeded_count": 50},
                         "tasks": {"t.small": {"keep_succeeded_count": 2,
                                               "keep_history": 1}}})
    ids = [succeed(queue, "t.small", policy) for _ in range(3)]
    other = succeed(queue, "t.other", policy)
    assert r.smembers(queue.keys.kept) == {"succeeded:2", "succeeded:50"}
    assert queue.get(ids[0]).history  # the task keeps its history
    assert not r.exists(queue.keys.history(other))
    assert trim(queue).succeeded == 1
    assert not exists(queue, ids[0]) and exists(queue, other)


def test_per_job_options_are_checked(queue: Queue):
    with pytest.raises(PayloadError, match=r"keep_succeeded has unknown key\(s\) ttl"):
        queue.enqueue("t.x", keep_succeeded={"ttl": "1h"})
    with pytest.raises(PayloadError, match="keep_dead must be a mapping"):
        queue.enqueue("t.x", keep_dead=5)
    with pytest.raises(PayloadError, match="keep_dead.count must be at least 0"):
        queue.enqueue("t.x", keep_dead={"count": -1})
    with pytest.raises(PayloadError, match="keep_history must be true or false"):
        queue.enqueue("t.x", keep_history="yes")


@pytest.mark.parametrize(("toml", "message"), [
    ('[defaults]\nkeep_succeeded = { age = "forever" }\n', "[defaults].keep_succeeded.age"),
    ('[defaults]\nkeep_dead = { count = -5 }\n', "[defaults].keep_dead.count"),
    ('[defaults]\nkeep_dead = { size = 5 }\n', "size"),
    ('[tasks."t.x"]\nkeep_history = "yes"\n', "keep_history: expected true or false"),
])
def test_config_errors_name_the_key(tmp_path: Path, toml: str, message: str):
    path = tmp_path / "forq.toml"
    path.write_text('[redis]\nurl = "redis://127.0.0.1:6379/7"\n[[queue]]\nname = "q"\n'
                    'concurrency = 1\n' + toml)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert message in str(error.value) and str(path) in str(error.value)


def test_queue_and_task_keep_reach_the_claimed_policy(tmp_path: Path):
    path = tmp_path / "forq.toml"
    path.write_text('[redis]\nurl = "redis://127.0.0.1:6379/7"\n'
                    '[defaults]\nkeep_dead = { age = "7d" }\n'
                    '[[queue]]\nname = "q"\nconcurrency = 1\n'
                    'keep_succeeded = { age = "30s", count = 500 }\n'
                    '[tasks."t.x"]\nkeep_history = true\n')
    policy = load_config(path).job_policy("q")
    assert policy["defaults"]["keep_succeeded_ms"] == 30_000
    assert policy["defaults"]["keep_succeeded_count"] == 500
    assert policy["defaults"]["keep_dead_ms"] == 7 * 86_400_000
    assert policy["defaults"]["keep_history"] == 0
    assert policy["tasks"]["t.x"]["keep_history"] == 1


# -- the reaper, in a real supervisor -------------------------------------------------------


def scrape(url: str, name: str, **labels: str) -> float | None:
    """One sample of a supervisor's /metrics, or None when absent."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        head, _, rest = series.partition("{")
        if head == name and ",".join(sorted(rest.rstrip("}").split(","))) == want:
            return float(value)
    return None


def test_the_supervisors_reaper_trims_and_its_metrics_show_it(tmp_path: Path, redis_url: str,
                                                              queue: Queue):
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2},
                          reaper_interval="100ms", max_attempts=1,
                          defaults='keep_succeeded = { age = "0s" }\n'
                                   'keep_dead = { count = 1 }')
    port = free_port()
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    url = f"http://127.0.0.1:{port}/metrics"
    jobs = [queue.enqueue("tests.echo", i) for i in range(3)]
    poison = [queue.enqueue("tests.fatal") for _ in range(3)]
    with SupervisorProcess(config).start() as sup:
        # each ended (its record may be trimmed already: count 1, age 0)
        wait_for(lambda: all(queue.redis.hget(queue.keys.job(job.id), "state")
                             in (None, "succeeded", "dead") for job in jobs + poison)
                 and queue.stats()["totals"].get("dead") == 3
                 and queue.stats()["totals"].get("succeeded") == 3,
                 timeout=30, message="every job to end")
        assert "Traceback" not in sup.log()
        wait_for(lambda: retained_counts(queue.redis, queue.keys) == {"succeeded": 0, "dead": 1},
                 message="the reaper trimmed to the configured keep")
        wait_for(lambda: scrape(url, "forq_retained_jobs", queue=queue.name, state="dead") == 1,
                 message="forq_retained_jobs shows the one dead record kept")
        assert scrape(url, "forq_retained_jobs", queue=queue.name, state="succeeded") == 0
        info = queue.redis.info("memory")
        assert scrape(url, "forq_redis_memory_max_bytes") == float(info["maxmemory"])
        assert (scrape(url, "forq_redis_memory_used_bytes") or 0) > 0
    assert not any(exists(queue, job.id) for job in jobs)
    assert queue.stats()["dead"] == 1


# -- forq purge -----------------------------------------------------------------------------


def forq(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "--redis", redis_url,
                           *args], capture_output=True, text=True, timeout=30, cwd=REPO)


def test_forq_purge_by_state_task_and_age(redis_url: str, queue: Queue, r):
    keep = succeed(queue, "t.keep")
    drop = [succeed(queue, "t.drop") for _ in range(3)]
    dead = die(queue, "t.drop")
    out = forq(redis_url, "purge", "-q", queue.name, "--state", "succeeded", "--task", "t.drop",
               "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"queue": queue.name, "state": "succeeded", "purged": 3}
    assert exists(queue, keep) and exists(queue, dead)
    assert not any(exists(queue, jid) for jid in drop)
    out = forq(redis_url, "purge", "-q", queue.name, "--state", "dead", "--older-than", "1h")
    assert out.returncode == 0 and "purged 0 dead" in out.stdout
    out = forq(redis_url, "purge", "-q", queue.name, "--state", "dead")
    assert out.returncode == 0 and "purged 1 dead" in out.stdout
    assert not exists(queue, dead) and r.zcard(queue.keys.dead) == 0


def test_forq_purge_refuses_a_live_state(redis_url: str, queue: Queue):
    out = forq(redis_url, "purge", "-q", queue.name, "--state", "pending")
    assert out.returncode == 2
    assert "--state" in out.stderr and "Traceback" not in out.stderr


def test_a_success_leaves_the_recently_finished_cap_to_the_trim_pass(queue: Queue,
                                                                   r: redis_lib.Redis):
    """An ack lists its job in the "recently finished" index without trimming it (one
    command less a job); the reaper's pass trims it to its newest 10,000."""
    r.zadd(queue.keys.finished, {f"old-{i}": i for i in range(10_000)})
    jid = succeed(queue)
    assert r.zcard(queue.keys.finished) == 10_001
    trim(queue)
    assert r.zcard(queue.keys.finished) == 10_000
    assert r.zscore(queue.keys.finished, jid) is not None
    assert r.zscore(queue.keys.finished, "old-0") is None


def test_a_jobs_first_claim_copies_its_policys_success_keep(queue: Queue, r: redis_lib.Redis):
    """The claim copies the keep of a success (the task's, else the queue's) from the
    supervisor's policy into the job, where the producer left it unset, so that its ack
    reads no policy; the compact record drops the copies."""
    policy = json.dumps({"defaults": {"keep_succeeded_count": 7, "keep_succeeded_ms": 50_000,
                                      "keep_history": 0},
                         "tasks": {"t.y": {"keep_succeeded_count": 3}}})
    mine = queue.enqueue("t.x", keep_succeeded={"count": 5}).id
    other = queue.enqueue("t.y").id
    plain = queue.enqueue("t.x").id
    leases = {lease.id: lease for lease in leasing(queue).claim(OWNER, 3, LONG, policy).leases}
    keep = ("keep_succeeded_count", "keep_succeeded_ms", "keep_history")
    assert r.hmget(queue.keys.job(mine), *keep)[0] == "5"  # the producer's wins
    assert r.hmget(queue.keys.job(other), *keep) == ["3", "50000", "0"]
    assert r.hmget(queue.keys.job(plain), *keep) == ["7", "50000", "0"]
    for jid, lease in leases.items():
        assert leasing(queue).ack(jid, lease.token, "null") == "ok"
    buckets = {b: set(r.zrange(queue.keys.kept_bucket(b), 0, -1)) for b in r.smembers(queue.keys.kept)}
    assert buckets == {"succeeded:5": {mine}, "succeeded:3": {other}, "succeeded:7": {plain}}
    assert r.hmget(queue.keys.job(plain), *keep) == [None, None, None]  # compact
    finished = int(r.hget(queue.keys.job(plain), "finished_at"))
    assert r.zscore(queue.keys.kept_bucket("succeeded:7"), plain) == finished + 50_000
