"""forq.supervisor.redis_io.shards on a real 3-node Redis Cluster: a pipeline run node by node.

* every node answers its own commands, in the pipeline's order, with the scripts
  reloaded on a node that lost them (NOSCRIPT) and a command sent to the wrong node
  (a stale slot map: MOVED) sent again where the slot lives — each run exactly once;
* a stopped node (SIGSTOP: silence) answers `ShardDown` for its commands only, in
  one socket timeout, and the others' commands run; `LeaseKeeper.extend_each` proves
  the leases of the answering shards and leaves the stopped shard's unproven;
* on a plain Redis, the one pipeline as before.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
import redis as redis_lib
from redis.crc import key_slot

from forq import Queue
from forq.store.connection import connect
from forq.store.topology import fail_fast
from forq.supervisor.leases.calls import leasing
from forq.supervisor.leases.keeper import LeaseKeeper
from forq.supervisor.redis_io.shards import PLAIN, ShardDown, execute_by_shard, shard_of
from tests.cluster_server import LocalCluster

pytestmark = pytest.mark.timeout(120)

OWNER = "shards-test:1"
TIMEOUT = 0.5  # the client's socket timeout: what a silent node costs


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3) as c:
        for node in c.nodes:  # a shard down leaves the others serving their slots
            node.client().config_set("cluster-require-full-coverage", "no")
        yield c


@pytest.fixture
def rc(cluster: LocalCluster):
    return connect(cluster.url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT,
                   **fail_fast(cluster.url))


def test_each_node_answers_its_commands_noscript_and_moved_included(cluster, rc):
    names = cluster.queue_per_node("h")
    queues = [Queue(name, redis=rc) for name in names.values()]
    for q in queues:
        q.enqueue_many([{"task": "t.x"} for _ in range(3)])
    assert {shard_of(rc, q.name) for q in queues} == {f"127.0.0.1:{p}" for p in names}
    for node in cluster.nodes:  # as after a restart or a failover: no scripts
        node.client().script_flush()
    # a stale slot map: the last queue's slot believed to be on the first queue's node
    stale = queues[-1]
    slot = key_slot(stale.name.encode())
    right = rc.nodes_manager.slots_cache[slot]
    rc.nodes_manager.slots_cache[slot] = rc.nodes_manager.slots_cache[
        key_slot(queues[0].name.encode())]
    pipe = rc.pipeline(transaction=False)
    for q in queues:
        leasing(q).claim(OWNER, 2, 60_000, client=pipe)
        pipe.zcard(q.keys.pending)
    sent = execute_by_shard(pipe)
    assert not sent.failed and len(sent.answered) == 2  # the stale slot's node: "moved"
    assert len(pipe.command_stack) == 0
    for i, q in enumerate(queues):
        assert len(leasing(q).parse_claim(sent.replies[2 * i]).leases) == 2, sent.replies
        stats = q.stats()
        assert (stats["active"], stats["pending"]) == (2, 1)  # each claim ran once
    # each queue's count came from its own node (3 or 1: a script re-sent after NOSCRIPT
    # runs after the pipeline's other commands, as in ForqClusterPipeline)
    assert all(sent.replies[2 * i + 1] in (1, 3) for i in range(3)), sent.replies
    assert rc.nodes_manager.slots_cache[slot][0].name == right[0].name  # learnt again


def test_a_stopped_node_fails_only_its_own_commands(cluster, rc):
    names = cluster.queue_per_node("h")
    victim = cluster.nodes[1]
    queues = {port: Queue(name, redis=rc) for port, name in names.items()}
    leases = {}
    for port, q in queues.items():
        q.enqueue("t.x")
        (lease,) = leasing(q).claim(OWNER, 1, 60_000).leases
        leases[port] = lease
    keeper = LeaseKeeper(lease_ttl=60.0)
    for port, lease in leases.items():
        keeper.add(queues[port].name, lease.id, lease.token, time.monotonic() - 30)
    before = {port: keeper.proven_until(lease.id) for port, lease in leases.items()}
    stopped = f"127.0.0.1:{victim.port}"
    victim.kill(signal.SIGSTOP)
    try:
        pipe = rc.pipeline(transaction=False)
        for q in queues.values():
            pipe.zcard(q.keys.active)
        started = time.monotonic()
        sent = execute_by_shard(pipe, down={stopped})
        assert time.monotonic() - started < 2 * TIMEOUT + 0.5
        assert set(sent.failed) == {stopped} and stopped not in sent.answered
        for port, reply in zip(queues, sent.replies, strict=True):
            if port == victim.port:
                assert isinstance(reply, ShardDown) and reply.shard == stopped
            else:
                assert reply == 1
        # the leases: the answering shards' proven anew, the stopped shard's not
        result = keeper.extend_each(rc, {q.name: q for q in queues.values()},
                                    failing={stopped})
        assert set(result.failed) == {stopped} and result.confirmed == 2
        for port, lease in leases.items():
            renewed = keeper.proven_until(lease.id) > before[port]
            assert renewed is (port != victim.port), port
        with pytest.raises(redis_lib.TimeoutError):  # the old call still says it failed
            keeper.extend(rc, {q.name: q for q in queues.values()})
    finally:
        victim.kill(signal.SIGCONT)
    # back: everything answers again
    result = keeper.extend_each(rc, {q.name: q for q in queues.values()})
    assert not result.failed and result.confirmed == 3


def test_a_plain_redis_is_one_shard(r, queue):
    assert shard_of(r, queue.name) == PLAIN
    queue.enqueue("t.x")
    pipe = r.pipeline(transaction=False)
    leasing(queue).claim(OWNER, 1, 60_000, client=pipe)
    pipe.zcard(queue.keys.active)
    sent = execute_by_shard(pipe)
    assert sent.answered == {PLAIN} and not sent.failed
    assert len(leasing(queue).parse_claim(sent.replies[0]).leases) == 1 and sent.replies[1] == 1


def test_shard_health_backs_off_each_shard_on_its_own(cluster, rc):
    from forq.supervisor.observe.metrics import Metrics
    from forq.supervisor.redis_io.health import RedisHealth
    from forq.supervisor.redis_io.shard_health import ShardHealth

    now = [100.0]
    metrics = Metrics(name="t")
    whole = RedisHealth(metrics.redis_error, clock=lambda: now[0])
    shards = ShardHealth(rc, whole, metrics.redis_error)
    downs: list[str] = []
    shards.on_down = lambda shard: (downs.append(shard), metrics.shard_state(shard, True))
    shards.on_up = lambda shard: metrics.shard_state(shard, False)
    names = cluster.queue_per_node("h")
    (a_port, a), (b_port, b) = list(names.items())[:2]
    a_shard = shard_of(rc, a)
    shards.failed({a_shard: TimeoutError("silent")}, "extend")
    shards.failed({a_shard: TimeoutError("silent")}, "claim")  # still down: said once
    assert downs == [a_shard] and shards.failing() == {a_shard}
    assert not shards.ready(a) and shards.ready(b) and whole.ready()
    assert 0 < shards.wait(a) <= 0.25 and shards.wait(b) == 0
    ready, held = shards.split_ready([a, b, b], lambda name: [name])
    assert (ready, held) == ([b, b], [a])
    assert shards.healthy_node().name != a_shard
    gauge = f'forq_redis_shard_down{{shard="{a_shard}"}}'
    assert f"{gauge} 1.0" in metrics.render().decode()
    now[0] += 1
    assert shards.ready(a)  # the backoff ran out: try it again
    shards.worked({a_shard})
    assert shards.failing() == set() and f"{gauge} 0.0" in metrics.render().decode()
    assert 'forq_redis_errors_total{op="extend"} 1.0' in metrics.render().decode()
