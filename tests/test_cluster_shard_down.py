"""One shard of a Redis Cluster down must not fence the others.

A real 3-node cluster (tests/cluster_server.py, with ``cluster-require-full-coverage
no``: the other shards keep serving their slots) and a real supervisor serving one
queue on each shard. Under load, one node is SIGSTOPped (silence, the harder case: a
killed node at least refuses connections). The jobs of the two healthy shards run to
completion, each exactly once, none fenced; the children of the stopped shard's jobs
are fenced within their lease, and those jobs run again once the node is back, never
overlapping the first run.
"""

from __future__ import annotations

import contextlib
import signal
import time
import urllib.request
import uuid
from collections.abc import Iterator

import psutil
import pytest
from redis.crc import key_slot

from forq import Queue
from forq.store.connection import connect
from forq.store.keys import FORMAT as FORMAT_KEY
from tests.cluster_server import LocalCluster
from tests.helpers import wait_for
from tests.redis_server import free_port
from tests.supervisors import SupervisorProcess, write_config

pytestmark = pytest.mark.timeout(180)

LEASE_TTL = 3.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3) as c:
        for node in c.nodes:  # a shard down leaves the others serving their slots
            node.client().config_set("cluster-require-full-coverage", "no")
        yield c


@contextlib.contextmanager
def logged_on_failure(sup: SupervisorProcess) -> Iterator[None]:
    try:
        yield
    except BaseException:
        print(sup.log())  # shown by pytest with the failure
        raise


def listened_on(nodes: list) -> list:
    """Those of `nodes` with a pub/sub subscriber (the supervisor's wake-ups)."""
    return [node for node in nodes
            if any(int(c.get("sub", 0)) > 0 for c in node.client().client_list())]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def runs(path) -> list[tuple[str, int, str]]:
    """tests.touch's lines: (job id, pid, "start" | "end")."""
    if not path.exists():
        return []
    return [(j, int(p), ev) for j, p, ev in (ln.split() for ln in path.read_text().splitlines())]


def test_a_stopped_shard_fences_only_its_own_jobs(cluster: LocalCluster, tmp_path):
    names = cluster.queue_per_node("s")
    rc = connect(cluster.url)
    queues = {name: Queue(name, redis=rc) for name in names.values()}
    log = tmp_path / "runs.txt"
    config = write_config(tmp_path / "forq.toml", cluster.url,
                          {name: 2 for name in names.values()}, lease_ttl=f"{LEASE_TTL:g}s")
    port = free_port()
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    with SupervisorProcess(config) as sup, logged_on_failure(sup):
        # the node to stop: the one the supervisor listens on for wake-ups
        victim = wait_for(lambda: next(iter(listened_on(cluster.nodes)), None), timeout=20,
                          message="the supervisor's wake-up subscription")
        down = names[victim.port]
        healthy = [name for port, name in names.items() if port != victim.port]
        # two long jobs running on the shard about to stop
        slow = [queues[down].enqueue("tests.touch", str(log), 5.0).id for _ in range(2)]
        wait_for(lambda: {j for j, _, ev in runs(log) if ev == "start"} >= set(slow),
                 timeout=20, message="the stopped shard's jobs to start")
        first_pids = {j: p for j, p, ev in runs(log) if j in slow}
        # load on the healthy shards, before and after the stop
        fast = {name: [queues[name].enqueue("tests.touch", str(log), 0.2).id
                       for _ in range(8)] for name in healthy}
        victim.kill(signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            for name in healthy:
                fast[name] += [queues[name].enqueue("tests.touch", str(log), 0.2).id
                               for _ in range(8)]
            # the stopped shard's children are fenced within their lease...
            wait_for(lambda: not any(psutil.pid_exists(p) for p in first_pids.values()),
                     timeout=LEASE_TTL + 5, message="the stopped shard's children fenced")
            fenced_after = time.monotonic() - stopped_at
            assert fenced_after < LEASE_TTL + 1.0, fenced_after
            gauge = f'forq_redis_shard_down{{shard="127.0.0.1:{victim.port}"}}'
            wait_for(lambda: f"{gauge} 1.0" in scrape(port), timeout=10,
                     message="the metric saying the shard is down")
            # wake-ups are heard on another node
            others = [node for node in cluster.nodes if node is not victim]
            wait_for(lambda: listened_on(others), timeout=10,
                     message="the wake-up subscription to move off the stopped node")
            # ...and the healthy shards' jobs all run, while the node is still stopped
            for name in healthy:
                for jid in fast[name]:
                    wait_for(lambda q=queues[name], j=jid: q.get(j).state == "succeeded",
                             timeout=40, message=f"job {jid} on a healthy shard")
            assert victim.proc is not None and psutil.Process(victim.proc.pid).status() == \
                psutil.STATUS_STOPPED
        finally:
            victim.kill(signal.SIGCONT)
        # the stopped shard's jobs run again once it is back, after the fenced run
        for jid in slow:
            wait_for(lambda j=jid: queues[down].get(j).state == "succeeded", timeout=60,
                     message=f"job {jid} on the shard that came back")
        assert f"{gauge} 0.0" in scrape(port)
        text = sup.log()
        assert "Traceback" not in text, text
    lines = runs(log)
    for name in healthy:  # each exactly once, to its end, never fenced
        for jid in fast[name]:
            mine = [(p, ev) for j, p, ev in lines if j == jid]
            assert [ev for _, ev in mine] == ["start", "end"], (jid, mine)
            job = queues[name].get(jid)
            assert job.crashes == 0 and job.attempts == 1, job.history
            warned = [ln for ln in text.splitlines()
                      if jid in ln and ("lease" in ln or "kill" in ln or "lost" in ln)]
            assert not warned, warned
    for jid in slow:  # fenced once (no end), then run to its end by a new child
        mine = [(p, ev) for j, p, ev in lines if j == jid]
        assert mine[0] == (first_pids[jid], "start") and (first_pids[jid], "end") not in mine
        assert [ev for p, ev in mine if p != first_pids[jid]] == ["start", "end"], mine
        assert jid in text and "lease not confirmed in time" in text


def test_a_supervisor_starts_and_serves_while_a_shard_is_stopped(cluster: LocalCluster,
                                                                 tmp_path):
    names = cluster.queue_per_node("s")
    # stop a node that does not hold forq's format key (without it nothing may start)
    home = cluster.node_for_slot(key_slot(FORMAT_KEY.encode()))
    victim = next(node for node in cluster.nodes if node is not home)
    down = names[victim.port]
    healthy = [name for port, name in names.items() if port != victim.port]
    paused = next(name for name in ("p" + uuid.uuid4().hex[:10] for _ in range(10_000))
                  if cluster.node_for_slot(key_slot(name.encode())) is victim)
    rc = connect(cluster.url)
    queues = {name: Queue(name, redis=rc) for name in [*names.values(), paused]}
    waiting = queues[down].enqueue("tests.echo", "after").id
    held = queues[paused].enqueue("tests.echo", "never").id
    config = write_config(tmp_path / "forq.toml", cluster.url,
                          {name: 2 for name in names.values()}, lease_ttl=f"{LEASE_TTL:g}s",
                          extra=f'[[queue]]\nname = "{paused}"\nconcurrency = 1\n'
                                f'paused = true\n')
    victim.kill(signal.SIGSTOP)
    try:
        with SupervisorProcess(config) as sup, logged_on_failure(sup):
            for name in healthy:
                job = queues[name].enqueue("tests.echo", name)
                assert job.wait(timeout=30) == {"args": [name], "kwargs": {}}
            victim.kill(signal.SIGCONT)
            # the stopped shard's queues are served once the node is back: the paused
            # one only once its config (paused = true) is written, so never
            wait_for(lambda: queues[down].get(waiting).state == "succeeded", timeout=40,
                     message="the job on the shard that came back")
            wait_for(lambda: queues[paused].is_paused(), timeout=20,
                     message="the config's pause written once the shard is back")
            assert queues[paused].get(held).state == "pending"
            assert rc.sismember("forq:queues", paused)
            assert "Traceback" not in sup.log(), sup.log()
    finally:
        victim.kill(signal.SIGCONT)
