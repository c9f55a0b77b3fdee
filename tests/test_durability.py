"""Replicated acknowledgements: ``WAIT`` after a durable enqueue and after the
supervisor's reports, on a real master + replica; and the topology settings of the
supervisor's config ([redis] cluster, min_replicas, wait_timeout, cluster and sentinel
URLs)."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from forq import NotReplicated, Queue
from forq.store.connection import connect
from forq.store.topology import set_durability
from forq.supervisor.config.load import ConfigError, load_config
from tests.cluster_server import ReplicatedRedis
from tests.helpers import wait_for
from tests.supervisors import SupervisorProcess, write_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def replicated() -> Iterator[ReplicatedRedis]:
    with ReplicatedRedis() as pair:
        yield pair


@pytest.fixture
def paused_replica(replicated: ReplicatedRedis) -> Iterator[None]:
    """The replica frozen (SIGSTOP): connected as far as the master knows, but it never
    acknowledges anything, like a replica on the far side of a partition."""
    replicated.replica.kill(signal.SIGSTOP)
    try:
        yield
    finally:
        replicated.replica.kill(signal.SIGCONT)
        replicated.wait_replica_in_sync()


def fresh(replicated: ReplicatedRedis, **options) -> Queue:
    return Queue("d" + uuid.uuid4().hex[:10], redis=connect(replicated.url), **options)


def test_durable_enqueue_waits_for_the_replica(replicated: ReplicatedRedis):
    q = fresh(replicated)
    replica = replicated.replica.client()
    job = q.enqueue("tests.echo", 1, durable=True)
    # WAIT returned only once the replica had processed the write
    assert replica.hget(q.keys.job(job.id), "state") == "pending"
    jobs = q.enqueue_many([{"task": "tests.echo", "args": [i]} for i in range(600)], durable=True)
    assert len(jobs) == 600
    assert replica.zcard(q.keys.pending) == 601
    # min_replicas on the queue, or on the client for every queue built on it
    assert fresh(replicated, min_replicas=1).enqueue("tests.echo").id
    client = connect(replicated.url)
    set_durability(client, 1, 0.5)
    assert Queue("d" + uuid.uuid4().hex[:10], redis=client).enqueue("tests.echo").id


def test_durable_enqueue_without_its_replica_fails_naming_the_job(
        replicated: ReplicatedRedis, paused_replica: None):
    q = fresh(replicated, wait_timeout=0.2)
    with pytest.raises(NotReplicated) as caught:
        q.enqueue("tests.echo", job_id="job-that-must-survive", durable=True)
    error = caught.value
    assert "job-that-must-survive" in str(error)
    assert "0 of 1 required replica(s)" in str(error) and "200 ms" in str(error)
    assert error.job_ids == ["job-that-must-survive"]
    assert (error.acknowledged, error.required) == (0, 1)
    # the master has it: the producer may retry with the same id, which is a duplicate
    assert q.get("job-that-must-survive").state == "pending"
    # durable=False never waits; a queue's min_replicas applies to enqueue_many too
    assert q.enqueue("tests.echo", durable=False).id
    strict = fresh(replicated, min_replicas=1, wait_timeout=0.1)
    with pytest.raises(NotReplicated, match="2 more"):
        strict.enqueue_many([{"task": "tests.echo", "job_id": f"m{i}"} for i in range(7)])


def _config_with_redis(path: Path, url: str, queue: str, redis_extra: str) -> Path:
    config = write_config(path, url, {queue: 2})
    text = config.read_text().replace(f'[redis]\nurl = "{url}"\n',
                                      f'[redis]\nurl = "{url}"\n{redis_extra}\n', 1)
    config.write_text(text)
    return config


@pytest.mark.timeout(90)
def test_supervisor_waits_for_replicas_after_its_reports(replicated: ReplicatedRedis, tmp_path):
    q = fresh(replicated)
    config = _config_with_redis(tmp_path / "forq.toml", replicated.url, q.name,
                                'min_replicas = 1\nwait_timeout = "300ms"')
    assert load_config(config).redis_min_replicas == 1
    with SupervisorProcess(config) as sup:
        job = q.enqueue("tests.echo", "replicated")
        assert job.wait(timeout=20) == {"args": ["replicated"], "kwargs": {}}
        wait_for(lambda: replicated.replica.client().hget(q.keys.job(job.id), "state")
                 == "succeeded", timeout=5, message="the ack on the replica")
        assert "not replicated" not in sup.log()

        replicated.replica.kill(signal.SIGSTOP)
        try:
            lonely = q.enqueue("tests.echo", "alone")
            assert lonely.wait(timeout=20) == {"args": ["alone"], "kwargs": {}}
            wait_for(lambda: f"reports of job(s) {lonely.id} not replicated" in sup.log(),
                     timeout=10, message="the supervisor to report the missing replica")
            assert "0 of 1 replica(s) acknowledged within 300 ms" in sup.log()
        finally:
            replicated.replica.kill(signal.SIGCONT)
            replicated.wait_replica_in_sync()


# -- configuration -----------------------------------------------------------------------


def _load(tmp_path: Path, redis_table: str):
    path = tmp_path / "forq.toml"
    path.write_text(f'[redis]\n{redis_table}\n\n[[queue]]\nname = "q"\nconcurrency = 1\n')
    return load_config(path, env={})


def test_config_topology_keys(tmp_path):
    plain = _load(tmp_path, 'url = "redis://10.0.0.1:7000/0"')
    assert (plain.redis_url, plain.redis_min_replicas, plain.redis_wait_timeout) == (
        "redis://10.0.0.1:7000/0", 0, 1.0)
    cfg = _load(tmp_path, 'url = "redis://10.0.0.1:7000"\ncluster = true\nmin_replicas = 1\n'
                          'wait_timeout = "250ms"')
    assert cfg.redis_url == "redis+cluster://10.0.0.1:7000"
    assert (cfg.redis_min_replicas, cfg.redis_wait_timeout) == (1, 0.25)
    cfg = _load(tmp_path, 'url = "redis+cluster://a:7000,b:7001,c:7002"')
    assert cfg.redis_url == "redis+cluster://a:7000,b:7001,c:7002"
    cfg = _load(tmp_path, 'url = "redis+sentinel://s1:26379,s2:26379/mymaster/2"')
    assert cfg.redis_url.endswith("/mymaster/2")


@pytest.mark.parametrize("table, message", [
    ('url = "redis+sentinel://s1:26379"', "[redis].url: expected a URL such as "
                                          '"redis+sentinel://host:port,host:port/mastername"'),
    ('url = "redis+cluster://a:7000,b:notaport"', "bad port in 'b:notaport'"),
    ('url = "redis+cluster://a:7000/4"', "a Redis Cluster has only db 0"),
    ('url = "redis+cluster://u:hunter2@a:7000"', "contains a password"),
    ("cluster = 1", "[redis].cluster: expected true or false"),
    ('url = "unix:///run/redis.sock"\ncluster = true', "[redis].cluster: true needs a redis://"),
    ("min_replicas = -1", "[redis].min_replicas: expected an integer from 0 to 16"),
    ('wait_timeout = "0s"', "[redis].wait_timeout: expected a duration > 0"),
])
def test_config_refuses_bad_topology_settings(tmp_path, table, message):
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, table)
    assert message in str(caught.value)
    assert "hunter2" not in str(caught.value)
