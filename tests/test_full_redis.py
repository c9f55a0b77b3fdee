"""A Redis that evicts, or that is full: refused at start, warned about, and survived.

Each test has a private redis-server, since they change its maxmemory settings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from forq import Queue, QueueFull
from forq.store.connection import connect
from tests.helpers import wait_for
from tests.redis_server import RedisServer
from tests.supervisors import REPO, SupervisorProcess, children_of, write_config


@pytest.fixture
def server():
    with RedisServer() as s:
        yield s


def start(tmp_path, server, allow_eviction: bool = False, **kw) -> SupervisorProcess:
    config = write_config(tmp_path / "forq.toml", server.url, {"q": 2}, **kw)
    if allow_eviction:
        config.write_text(config.read_text().replace("[redis]\n", "[redis]\nallow_eviction = "
                                                     "true\n", 1))
    return SupervisorProcess(config)


@pytest.mark.timeout(60)
def test_an_evicting_redis_is_refused_at_start_unless_allowed(tmp_path, server):
    connect(server.url).config_set("maxmemory-policy", "allkeys-lru")
    sup = start(tmp_path, server)
    sup.start(wait_ready=False)
    assert sup.wait(timeout=30) == 2
    refusal = [ln for ln in sup.log().splitlines() if "maxmemory-policy" in ln]
    assert len(refusal) == 1, sup.log()
    assert "allkeys-lru" in refusal[0] and "noeviction" in refusal[0]
    assert "allow_eviction = true" in refusal[0] and "Traceback" not in sup.log()

    with start(tmp_path, server, allow_eviction=True) as allowed:
        assert "may evict (delete) jobs" in allowed.log()
        assert Queue("q", redis=connect(server.url)).enqueue("tests.echo", 1).wait(
            timeout=20) == {"args": [1], "kwargs": {}}


def test_forq_stats_warns_about_an_evicting_redis(server):
    client = connect(server.url)
    Queue("q", redis=client).enqueue("tests.echo", 1)

    def stats():
        return subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "--redis",
                               server.url, "stats"], capture_output=True, text=True,
                              cwd=str(REPO), timeout=30)
    assert "maxmemory-policy" not in stats().stderr
    client.config_set("maxmemory-policy", "volatile-lru")
    out = stats()
    assert out.returncode == 0 and "q" in out.stdout
    assert "warning: Redis maxmemory-policy is volatile-lru" in out.stderr, out.stderr


@pytest.mark.timeout(90)
def test_a_full_redis_refuses_enqueues_whole_and_running_jobs_keep_their_leases(tmp_path,
                                                                                server):
    client = connect(server.url)
    q = Queue("q", redis=client)
    with start(tmp_path, server, lease_ttl="1s") as sup:
        running = q.enqueue("examples.sleep", 3).id
        wait_for(lambda: children_of(sup.pid), message="the job's child")
        # full: maxmemory below what Redis uses now, noeviction (the default)
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) // 2)
        keys = client.dbsize()
        with pytest.raises(QueueFull) as refused:
            q.enqueue_many([{"task": "tests.echo", "args": [i]} for i in range(5)])
        message = str(refused.value)
        assert "out of memory" in message and "nothing was enqueued" in message, message
        assert client.dbsize() == keys  # nothing half-written
        with pytest.raises(QueueFull):
            q.enqueue("tests.echo", 1)
        # the running job keeps its lease past several TTLs (extend may run when Redis is
        # full), and its report lands: an ack only frees or rewrites what the job held
        job = wait_for(lambda: (j := q.get(running)).state == "succeeded" and j, timeout=20,
                       message=f"the job done while Redis is full: {sup.log()}")
        assert len([e for e in job.history if e["event"] == "claimed"]) == 1, job.history
        assert job.crashes == 0 and "lease" not in sup.log(), sup.log()
        client.config_set("maxmemory", 0)
        assert q.enqueue("tests.echo", 2).wait(timeout=20) == {"args": [2], "kwargs": {}}
        sup.signal(signal.SIGTERM)
        assert sup.wait(timeout=20) == 0


@pytest.mark.timeout(90)
def test_a_crash_reported_while_redis_is_full_keeps_its_lease_until_the_report_lands(
        tmp_path, server):
    """The parent's crash report (expire) is refused by a full Redis: it waits, the lease
    is extended meanwhile, and once Redis frees the crash is recorded as it happened —
    never left to expire and be reclaimed as a crash nobody can explain."""
    client = connect(server.url)
    q = Queue("q", redis=client)
    with start(tmp_path, server, lease_ttl="1s") as sup:
        job_id = q.enqueue("tests.wait_file", str(tmp_path / "never"), max_crashes=3).id
        (child,) = wait_for(lambda: children_of(sup.pid), message="the job's child")
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) // 2)
        os.kill(child, signal.SIGKILL)
        wait_for(lambda: "its report waits" in sup.log(), timeout=20,
                 message=f"the refused report said: {sup.log()}")
        killed_ms = int(client.time()[0]) * 1000
        # extended while full, past three TTLs after the kill: the lease is still ours
        wait_for(lambda: int(client.hget(f"forq:{{q}}:job:{job_id}", "lease_deadline")
                             or 0) > killed_ms + 3000, timeout=20,
                 message="the lease extended while the report waits")
        assert q.get(job_id).state == "active"
        client.config_set("maxmemory", 0)
        job = wait_for(lambda: (j := q.get(job_id)).crashes == 1 and j, timeout=20,
                       message="the crash recorded")
        crashed = [e for e in job.history if e["event"] == "crashed"]
        assert len(crashed) == 1 and "SIGKILL" in crashed[0]["reason"], job.history
        assert not any("lease expired" in str(e.get("reason")) for e in job.history), \
            job.history
        assert f"{job_id} tests.wait_file: report failed" not in sup.log(), sup.log()
        sup.signal(signal.SIGTERM)
        assert sup.wait(timeout=20) == 0
