"""A supervisor cut off from Redis by a partition (silence, not errors): it fences its
child before the lease can be reclaimed elsewhere, and serves again once the path heals.
The path is chaos's TCP proxy (chaos/proxy.py), switched to blackhole."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from chaos.proxy import BLACKHOLE, PASS, Proxy
from forq import Queue
from forq.store.connection import connect
from tests.helpers import wait_for
from tests.redis_server import RedisServer
from tests.supervisors import SupervisorProcess, write_config


def runs(path) -> list[tuple[str, int, str]]:
    if not path.exists():
        return []
    return [(j, int(p), ev) for j, p, ev in (ln.split() for ln in path.read_text().splitlines())]


@pytest.mark.timeout(120)
def test_a_blackholed_supervisor_fences_its_child_before_the_job_runs_elsewhere(tmp_path):
    with RedisServer() as server:
        proxy = Proxy(server.port)
        proxy.start()
        try:
            far = write_config(tmp_path / "far.toml", proxy.url, {"q": 1}, lease_ttl="2s")
            near = write_config(tmp_path / "near.toml", server.url, {"q": 1}, lease_ttl="2s")
            q = Queue("q", redis=connect(server.url))
            touch = tmp_path / "touch"
            with SupervisorProcess(far) as a:
                jid = q.enqueue("tests.touch", str(touch), 6.0).id
                wait_for(lambda: runs(touch), timeout=20, message="the job started on a")
                ((_, first, _),) = runs(touch)
                proxy.set_mode(BLACKHOLE)
                cut_at = time.monotonic()
                # a fences its child within its lease, though Redis never answers
                wait_for(lambda: not psutil.pid_exists(first), timeout=10,
                         message=f"a fences its child: {a.log()}")
                assert time.monotonic() - cut_at < 2.0 + 0.3, a.log()
                wait_for(lambda: "lease not confirmed in time" in a.log(), timeout=10,
                         message="a says why")
                with SupervisorProcess(near) as b:
                    job = wait_for(lambda: (j := q.get(jid)).state == "succeeded" and j,
                                   timeout=30, message="b runs the job again")
                    starts = [(p, ev) for j, p, ev in runs(touch) if j == jid]
                    assert (first, "end") not in starts, starts  # a's child never finished
                    assert job.crashes == 1 and job.result != first, job.history
                    # healed: a reconnects and serves again
                    proxy.set_mode(PASS)
                    wait_for(lambda: "redis reachable again" in a.log(), timeout=20,
                             message=f"a back: {a.log()}")
                    b.signal(signal.SIGTERM)
                    assert b.wait(timeout=20) == 0
                again = q.enqueue("tests.echo", 1)
                assert again.wait(timeout=20) == {"args": [1], "kwargs": {}}
                assert "Traceback" not in a.log()
        finally:
            proxy.stop()
