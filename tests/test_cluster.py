"""forq on a real Redis Cluster: three local shards (``redis-server --cluster-enabled``
joined with ``redis-cli --cluster create``), started once for this module.

* the core suite's key transition cases (imported from test_transitions) run here with
  `r` and `queue` on the cluster, each test on a fresh queue wherever its slot falls;
* every transition runs for queues on all three shards, in cross-shard pipelines as
  the supervisor sends them, under MONITOR on every node: every key any script
  touches (and every channel it publishes to) must hash to the slot of the queue's
  hash tag. Redis 7 itself only refuses a key on *another node*; a key on another slot
  of the same node would pass there and break on the first resharding, so the test
  checks slots, not nodes;
* NOSCRIPT (a shard restarted or failed over: scripts are not replicated) is handled
  inside cluster pipelines without applying any transition twice;
* a supervisor serves two queues on different shards: jobs, a follow-up to the other
  queue, a cron schedule, the supervisor registry and pub/sub wake-ups all work.
"""

from __future__ import annotations

import re
import statistics
import threading
import uuid
from collections.abc import Iterator

import pytest
import redis as redis_lib
from redis.crc import key_slot

from forq import JobFailed, Queue
from forq.payload import build_spec
from forq.schedules import Schedules
from forq.store.connection import connect
from forq.store.scripts import TRANSITIONS
from forq.store.topology import ForqCluster, is_cluster, parse_url
from forq.supervisor.leases.calls import LeaseCalls, leasing
from forq.supervisor.redis_io.relay import BatchRelay
from tests.cluster_server import LocalCluster
from tests.helpers import wait_for
from tests.supervisors import SupervisorProcess, write_config

# The core suite's key cases, re-run here against the cluster (the `r` fixture below
# overrides conftest's, so conftest's `queue` and test_transitions' `other_queue` are
# built on the cluster client).
from tests.test_transitions import (  # noqa: F401
    other_queue,
    test_ack_enqueues_followups_atomically,
    test_ack_stores_result_and_succeeds,
    test_ack_with_stale_token_is_lost_and_changes_nothing,
    test_cancel_in_every_state,
    test_claim_priority_order_then_fifo,
    test_claim_promotes_due_scheduled_jobs,
    test_claim_respects_max_in_flight,
    test_claim_respects_rate_limit,
    test_claim_sets_the_lease,
    test_crashes_past_max_go_dead_with_the_last_reason,
    test_enqueue_due_now_is_pending_with_its_record_and_history,
    test_enqueue_many_beyond_one_script_batch_keeps_order,
    test_enqueue_with_delay_is_scheduled_until_due,
    test_expire_then_reclaim_returns_job_to_its_place,
    test_extend_renews_live_leases_and_reports_lost_ones,
    test_extend_through_a_pipeline,
    test_fail_retries_with_exponential_backoff_then_dead,
    test_find_job_across_queues,
    test_idempotency_key_while_live_returns_the_first_job,
    test_purge_dead_by_ids_and_all,
    test_reclaim_takes_a_lease_expired_by_its_deadline,
    test_record_done_then_reclaim_succeeds_without_rerun,
    test_release_returns_to_pending_without_counting,
    test_requeue_dead_by_ids,
    test_stats_counts,
)

pytestmark = pytest.mark.timeout(120)

OWNER = "cluster-test:1"
LONG = 60_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3) as c:
        yield c


@pytest.fixture(scope="module")
def rc(cluster: LocalCluster) -> ForqCluster:
    return connect(cluster.url)


@pytest.fixture
def r(rc: ForqCluster) -> ForqCluster:
    """Overrides conftest's `r`: the imported core cases run on the cluster."""
    return rc


@pytest.fixture
def redis_url(cluster: LocalCluster) -> str:
    return cluster.url


def names_on_distinct_shards(cluster: LocalCluster, count: int = 3) -> list[str]:
    """Fresh queue names whose slots are served by `count` different nodes."""
    return list(cluster.queue_per_node("c", count).values())


def drop_queue(client, name: str) -> None:
    keys = list(client.scan_iter(match=f"forq:{{{name}}}:*", count=1000))
    for key in keys:
        client.delete(key)
    client.srem("forq:queues", name)


# -- the client ------------------------------------------------------------------------


def test_cluster_urls_give_a_cluster_client(cluster: LocalCluster):
    client = connect(cluster.url)
    assert isinstance(client, ForqCluster) and is_cluster(client)
    assert client.ping()
    # [redis] cluster = true: any node's plain URL
    plain = connect(f"redis://127.0.0.1:{cluster.ports[1]}/0", cluster=True)
    assert isinstance(plain, ForqCluster)
    assert len(plain.get_primaries()) == 3
    assert parse_url("redis+cluster://a:1,b:2")["hosts"] == [("a", 1), ("b", 2)]
    with pytest.raises(ValueError, match="db 0"):
        parse_url("redis+cluster://a:1/3")
    # a pipeline counts what it holds, as the supervisor's reports rely on
    pipe = client.pipeline(transaction=False)
    leasing(Queue("anywhere", redis=client)).claim(OWNER, 1, LONG, client=pipe)
    pipe.zcard("forq:{elsewhere}:pending")
    assert len(pipe.command_stack) == 2
    pipe.execute()
    assert len(pipe.command_stack) == 0


# -- every key a script touches is in its queue's slot --------------------------------------

_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
_LINE = re.compile(r"^[\d.]+ \[\d+ ([^\]]*)\] (.*)$")


class Monitors:
    """MONITOR on every node, each read by a thread until a marker ECHO arrives."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.marker = "forq-monitor-stop-" + uuid.uuid4().hex
        self.lines: dict[int, list[str]] = {}
        self.threads: list[threading.Thread] = []
        self.monitors = []

    def __enter__(self) -> Monitors:
        for node in self.cluster.nodes:
            monitor = node.client(socket_timeout=30).monitor()
            monitor.__enter__()
            self.monitors.append(monitor)
            lines: list[str] = []
            self.lines[node.port] = lines
            thread = threading.Thread(target=self._read, args=(monitor, lines), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def _read(self, monitor, lines: list[str]) -> None:
        while True:
            line = monitor.connection.read_response()
            if isinstance(line, bytes):
                line = line.decode(errors="replace")
            if self.marker in line:
                return
            lines.append(line)

    def __exit__(self, *exc: object) -> None:
        for node in self.cluster.nodes:
            node.client().echo(self.marker)
        for thread in self.threads:
            thread.join(timeout=20)
        for monitor in self.monitors:
            monitor.__exit__()
        assert not any(t.is_alive() for t in self.threads), "a MONITOR reader did not stop"


def script_runs(lines: list[str]) -> list[dict]:
    """Group one node's MONITOR lines into script runs: the EVALSHA/EVAL line (MONITOR
    shows it first) and the commands its Lua executed, in order."""
    runs: list[dict] = []
    current = None
    for line in lines:
        match = _LINE.match(line)
        if not match:
            continue
        who, rest = match.groups()
        args = _ARG.findall(rest)
        if not args:
            continue
        if who == "lua":
            assert current is not None, f"Lua command without a script call: {line}"
            current["calls"].append(args)
        elif args[0].upper() in ("EVALSHA", "EVAL"):
            current = {"sha": args[1], "keys": args[3:3 + int(args[2])], "calls": []}
            runs.append(current)
        else:
            current = None
    return runs


GLOBAL_SCRIPTS = {"schedule_define", "schedule_fired"}  # forq:schedules:*, not a queue's


def workout(queues: list[Queue], rc) -> None:
    """Every transition, for every queue, batched across shards as a supervisor does."""
    for q in queues:
        q.enqueue_many([
            {"task": "t.a", "backoff": {"base": "1h"}}, {"task": "t.b", "priority": 5}, {"task": "t.c", "delay": "1h"},
            {"task": "t.d", "max_attempts": 1}, {"task": "t.e", "key": "only-one"},
        ])
    pipe = rc.pipeline(transaction=False)
    for q in queues:
        leasing(q).claim(OWNER, 4, LONG, client=pipe)
    claims = [leasing(q).parse_claim(reply) for q, reply in zip(queues, pipe.execute(), strict=True)]
    by_task = [{lease.job.task: lease for lease in c.leases} for c in claims]
    assert all(set(tasks) == {"t.a", "t.b", "t.d", "t.e"} for tasks in by_task), by_task

    pipe = rc.pipeline(transaction=False)
    for q, leases in zip(queues, by_task, strict=True):
        leasing(q).extend([(lease.id, lease.token) for lease in leases.values()], LONG, client=pipe)
    for reply in pipe.execute():
        assert LeaseCalls.parse_extend(reply)[:2] == ([], [])

    pipe = rc.pipeline(transaction=False)
    for q, leases in zip(queues, by_task, strict=True):
        b, a, d, e = (leases[t] for t in ("t.b", "t.a", "t.d", "t.e"))
        follow = build_spec("t.follow", {"job_id": f"{b.id}-1"})
        leasing(q).ack(b.id, b.token, '"done"', [follow], client=pipe)
        leasing(q).ack(b.id, "stale-token", '"again"', client=pipe)
        leasing(q).fail(a.id, a.token, {"message": "boom"}, client=pipe)
        leasing(q).fail(d.id, d.token, {"message": "boom"}, client=pipe)
        leasing(q).expire(e.id, e.token, "SIGKILL", client=pipe)
        leasing(q).reclaim(OWNER, 3, client=pipe)
    replies = pipe.execute()
    for i in range(len(queues)):
        ack, stale, fail_a, fail_d, expired, reclaimed = replies[6 * i:6 * i + 6]
        assert (ack, stale, expired) == ("ok", "lost", "ok")
        assert LeaseCalls.parse_fail(fail_a).outcome == "retry"
        assert LeaseCalls.parse_fail(fail_d).outcome == "dead"
        assert LeaseCalls.parse_reclaim(reclaimed)[0] == 1

    for q, leases in zip(queues, by_task, strict=True):
        again = leasing(q).claim(OWNER, 5, LONG)
        assert {lease.job.task for lease in again.leases} == {"t.e", "t.follow"}
        for lease in again.leases:
            assert leasing(q).set_output(lease.id, lease.token, "printed\n") == "ok"
            assert leasing(q).record_progress([(lease.id, lease.token, 0.5, "half")]) == ["ok"]
            assert leasing(q).record_step(lease.id, lease.token, "s1", '{"a":1}') == "ok"
            assert leasing(q).release(lease.id, lease.token, "drain") == "ok"
        assert q.cancel(next(iter(q.redis.zrange(q.keys.scheduled, 0, 0)))) == "cancelled"
        dead_id = leases["t.d"].id
        assert q.requeue_dead([dead_id]) == (1, [])
        q.set_limits(rate=(1000, 1), max_in_flight=10)
        lease = next(x for x in leasing(q).claim(OWNER, 5, LONG).leases if x.id == dead_id)
        leasing(q).record_done(dead_id, '"r"', 60_000)
        assert leasing(q).fail(dead_id, lease.token, {"message": "x"}, mode="fatal").outcome == "dead"
        assert q.purge_dead() == (1, [])
        q.set_limits(rate=None, max_in_flight=None)
        assert q.stats()["succeeded"] == 1
        assert q.pause() and leasing(q).claim(OWNER, 5, LONG).leases == []
        assert q.resume()
        assert q.resume(task="t.a") is False  # no circuit breaker tripped: nothing parked
        assert leasing(q).sweep_expired(OWNER) == []
        # groups: their keys carry the group key after the queue's tag, braces and all
        q.set_limits(group_concurrency=1, group_rate=(1000, 1))
        q.enqueue_many([{"task": "t.g", "group": "{elsewhere}"}] * 2)
        grouped = [x for x in leasing(q).claim(OWNER, 10, LONG).leases if x.job.task == "t.g"]
        assert len(grouped) == 1 and leasing(q).ack(grouped[0].id, grouped[0].token, "1") == "ok"
        q.set_limits(group_concurrency=None, group_rate=None)
        # an operator's changes, a search, throttles, a handler reading its parents
        later = q.enqueue("t.later", delay="1h")
        q.set_priority(later.id, 3)
        q.reschedule(later.id, delay="2h")
        q.promote(later.id)
        assert q.find("pending").jobs
        q.throttle("1s")
        assert q.unthrottle()
        parent = q.enqueue("t.parent", job_id=f"{later.id}-p")
        lease = next(x for x in leasing(q).claim(OWNER, 10, LONG).leases if x.id == parent.id)
        page = leasing(q).read_parents(parent.id, lease.token, 0, 10, 1 << 20)
        assert (page.status, page.entries) == ("ok", [])
        assert leasing(q).throttle(parent.id, lease.token, 1, False, "429").outcome == "throttled"
        q.unthrottle()
    # run-time schedules: one global key each (not a queue's), on whichever shard
    schedules = Schedules(rc)
    schedules.add("cluster-workout", "@every 1h", queue=queues[0].name, task="t.tick")
    schedules.trigger("cluster-workout")
    schedules.remove("cluster-workout")

    # a batch on one shard with a member on another: its end crosses by the relay
    home, away = queues[0], queues[1]
    batch = home.batch([{"task": "t.m", "queue": away.name}], on_complete="t.cb")
    member = next(x for x in leasing(away).claim(OWNER, 10, LONG).leases if x.id == batch.member_ids[0])
    assert leasing(away).ack(member.id, member.token, "1") == "ok"
    relay = BatchRelay(lambda name: next(q for q in queues if q.name == name))
    pipe = rc.pipeline(transaction=False)
    relay.send(pipe, [away.name])
    assert relay.deliver(rc, [away.name], pipe.execute()) == 1
    assert batch.status().state == "succeeded"


def test_every_key_a_script_touches_hashes_to_its_queues_slot(cluster: LocalCluster, rc):
    names = names_on_distinct_shards(cluster, 3)
    queues = [Queue(name, redis=rc) for name in names]
    slots = {key_slot(name.encode()): name for name in names}
    assert len({cluster.node_for_slot(s).port for s in slots}) == 3
    try:
        with Monitors(cluster) as monitors:
            workout(queues, rc)
        sha_names = {getattr(queues[0].scripts, t).sha: t for t in TRANSITIONS}
        parser_conn = cluster.nodes[0].client()
        seen: set[str] = set()
        touched = 0
        for port, lines in monitors.lines.items():
            for run in script_runs(lines):
                if run["sha"] not in sha_names:
                    continue  # another client's script (none expected on this cluster)
                seen.add(sha_names[run["sha"]])
                if sha_names[run["sha"]] in GLOBAL_SCRIPTS:  # one global key, one slot
                    assert len({key_slot(k.encode()) for k in run["keys"]}) == 1
                    continue
                declared = {key_slot(k.encode()) for k in run["keys"]}
                assert len(declared) == 1 and declared <= set(slots), run["keys"]
                slot = declared.pop()
                assert cluster.node_for_slot(slot).port == port
                for args in run["calls"]:
                    command = args[0].upper()
                    if command == "PUBLISH":
                        assert args[1] == f"forq:{{{slots[slot]}}}:wake", args
                        continue
                    keys = rc.commands_parser.get_keys(parser_conn, *args) or []
                    for key in keys:
                        touched += 1
                        assert key_slot(key.encode()) == slot, (
                            f"{sha_names[run['sha']]} on queue {slots[slot]} touched {key} "
                            f"(slot {key_slot(key.encode())}, expected {slot})")
                        assert key.startswith(f"forq:{{{slots[slot]}}}:"), key
        assert seen == set(TRANSITIONS), f"transitions not exercised: {set(TRANSITIONS) - seen}"
        assert touched > 100

        # and at rest: each queue's keys live on the node that serves their slot
        for node in cluster.nodes:
            client = node.client()
            for name in names:
                for key in client.scan_iter(match=f"forq:{{{name}}}:*", count=1000):
                    slot = client.execute_command("CLUSTER", "KEYSLOT", key)
                    assert slot == key_slot(name.encode())
                    assert cluster.node_for_slot(slot).port == node.port
    finally:
        for name in names:
            drop_queue(rc, name)


# -- NOSCRIPT ------------------------------------------------------------------------------


def test_noscript_in_a_cluster_pipeline_reloads_and_runs_each_call_once(cluster, rc):
    names = names_on_distinct_shards(cluster, 3)
    queues = [Queue(name, redis=rc) for name in names]
    try:
        for q in queues:
            q.enqueue_many([{"task": "t.x"} for _ in range(3)])
        for node in cluster.nodes:  # as after a restart or failover of every shard
            node.client().script_flush()
        pipe = rc.pipeline(transaction=False)
        for q in queues:
            leasing(q).claim(OWNER, 2, LONG, client=pipe)
            pipe.execute_command("WAIT", 0, 100, target_nodes=rc.get_node_from_key(q.keys.pending))
        replies = pipe.execute()
        for i, q in enumerate(queues):
            assert len(leasing(q).parse_claim(replies[2 * i]).leases) == 2
            assert replies[2 * i + 1] == 0  # the WAIT after it, re-sent after the reload
            stats = q.stats()
            assert (stats["active"], stats["pending"]) == (2, 1)  # the claim ran once
        # a direct call (not pipelined) reloads through redis-py's Script
        for node in cluster.nodes:
            node.client().script_flush()
        assert len(leasing(queues[0]).claim(OWNER, 5, LONG).leases) == 1
        # a real error is still raised, annotated, after the reload
        pipe = rc.pipeline(transaction=False)
        pipe.zcard(queues[1].keys.pending)
        pipe.hset(queues[1].keys.pending, "f", "v")  # WRONGTYPE
        with pytest.raises(redis_lib.ResponseError, match="WRONGTYPE"):
            pipe.execute()
    finally:
        for name in names:
            drop_queue(rc, name)


# -- a supervisor on the cluster -------------------------------------------------------------


@pytest.mark.timeout(120)
def test_supervisor_serves_queues_on_two_shards(cluster, rc, tmp_path):
    qa, qb = names_on_distinct_shards(cluster, 2)
    a, b = Queue(qa, redis=rc), Queue(qb, redis=rc)
    out = tmp_path / "touched.txt"
    schedule = (f'[[schedule]]\nname = "tick-{qa}"\ncron = "@every 1s"\nqueue = "{qa}"\n'
                f'task = "tests.echo"\nargs = ["cron"]\n')
    config = write_config(tmp_path / "forq.toml", cluster.url, {qa: 2, qb: 2},
                          lease_ttl="3s", extra=schedule)
    try:
        with SupervisorProcess(config) as sup:
            jobs = [a.enqueue("tests.echo", i) for i in range(5)]
            jobs += [b.enqueue("tests.echo", i) for i in range(5)]
            for job in jobs:
                assert job.wait(timeout=20)["args"] is not None
            # failures and crashes report through the same cross-shard pipelines
            failing = [b.enqueue("tests.fail", max_attempts=1), a.enqueue("examples.exit", 3,
                                                                          max_crashes=1)]
            for q, job in zip((b, a), failing, strict=True):
                wait_for(lambda q=q, j=job: q.get(j.id).state == "dead", timeout=20,
                         message=f"job {job.id} dead")
            # a follow-up from a job on shard A to a queue on shard B
            parent = a.enqueue("tests.fanout", str(out), qb)
            parent.wait(timeout=20)
            kids = ((b, f"{parent.id}-1"), (a, f"{parent.id}-2"))
            wait_for(lambda: all(q.get(jid).state == "succeeded" for q, jid in kids),
                     timeout=20, message="both follow-ups to succeed")
            assert out.read_text().count(" end") == 2
            # pick-up by pub/sub, not by the 2 s safety poll, on both shards
            waits = []
            for q in (a, b, a, b, a, b):
                job = q.enqueue("tests.echo", "latency")
                job.wait(timeout=20)
                f = q.get(job.id).fields
                waits.append((int(f["started_at"]) - int(f["enqueued_at"])) / 1000)
            assert statistics.median(waits) < 0.5, waits
            # the cron schedule fired (forq:schedules and the idempotency key in cluster)
            wait_for(lambda: rc.hget("forq:schedules", f"tick-{qa}"), timeout=10,
                     message="the schedule to fire")
            # the supervisor registry
            from forq.fleet import live_supervisors

            wait_for(lambda: any(s["pid"] == sup.pid for s in live_supervisors(rc)),
                     timeout=10, message="the supervisor's heartbeat")
            # what `forq web` reads, across shards
            from forq.web import data

            assert {qa, qb} <= {q["name"] for q in data.overview(rc)["queues"]}
            assert data.job_page(rc, qb, "dead").total == 1
            assert len(data.job_page(rc, qa, "finished").rows) >= 5
            assert data.search(rc, jobs[0].id) == [{"queue": qa, "id": jobs[0].id,
                                                    "match": "id"}]
            assert data.running(rc)["now_ms"] > 0
            assert f"tick-{qa}" in [row["name"] for row in data.schedules(rc)["rows"]]
            assert "Traceback" not in sup.log(), sup.log()
    finally:
        rc.hdel("forq:schedules", f"tick-{qa}")
        rc.hdel("forq:schedules:defs", f"tick-{qa}")
        for name in (qa, qb):
            drop_queue(rc, name)


def test_events_and_job_wait_on_a_cluster(cluster: LocalCluster, rc):
    """A queue's event stream lives in its slot: followed (XRANGE, XREAD BLOCK) and
    waited on through the cluster client, replace and on_dead in the enqueue and fail
    scripts there too."""
    (name,) = names_on_distinct_shards(cluster, 1)
    queue = Queue(name, redis=rc)
    try:
        queue.set_on_dead("alerts.died")
        job = queue.enqueue("t", 1, key="k", replace=True)
        assert queue.enqueue("t", 2, key="k", replace=True).id == job.id

        def finish() -> None:
            lease = leasing(queue).claim(OWNER, 1, LONG).leases[0]
            leasing(queue).fail(lease.id, lease.token, {"message": "no"}, mode="fatal")

        thread = threading.Timer(0.2, finish)
        thread.start()
        with pytest.raises(JobFailed, match="no"):
            job.wait(timeout=20)
        thread.join()
        assert [e.kind for e in queue.events()] == ["enqueued", "replaced", "started", "failed",
                                                   "dead", "enqueued"]
        assert queue.get(f"{job.id}-on-dead-1").kwargs["job_id"] == job.id
        assert [e.kind for e in queue.events(last=1, follow=True, timeout=0.3)] == ["enqueued"]
    finally:
        drop_queue(rc, name)
