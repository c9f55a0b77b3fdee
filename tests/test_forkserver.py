"""The fork server: job children are forked by a lean helper process, not by the
37 MiB supervisor. It must be small (no redis), die with its supervisor, be survived
when it crashes, be replaced on a reload that changes `imports`, and be optional."""

from __future__ import annotations

import os
import re
import signal

import psutil
import pytest

from forq import Queue
from forq.supervisor.fork.client import REPLY_TIMEOUT
from tests.helpers import wait_for, wait_job
from tests.supervisors import (
    SupervisorProcess,
    children_of,
    fork_servers_of,
    wait_children,
    write_config,
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def start(tmp_path, redis_url, queue: Queue, concurrency: int = 1, **options) -> SupervisorProcess:
    options.setdefault("drain_timeout", "2s")
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: concurrency},
                          **options)
    return SupervisorProcess(config).start()


def the_fork_server(sup: SupervisorProcess) -> int:
    (server,) = wait_for(lambda: fork_servers_of(sup.pid), timeout=10, message="a fork server")
    return server


@pytest.mark.timeout(60)
def test_fork_server_is_lean_forks_the_jobs_and_dies_with_the_supervisor(tmp_path, redis_url,
                                                                         queue):
    sup = start(tmp_path, redis_url, queue)
    try:
        server = the_fork_server(sup)
        assert psutil.Process(server).cmdline()[0].startswith("forq: fork server")
        # small: well below the supervisor, which holds redis, metrics and the loop
        sup_rss = psutil.Process(sup.pid).memory_info().rss
        server_rss = psutil.Process(server).memory_info().rss
        assert server_rss < 0.75 * sup_rss, (server_rss >> 20, sup_rss >> 20)
        # a job's child is the fork server's, and inherits no redis from it
        done = queue.enqueue("tests.lineage").wait(timeout=10)
        assert done["ppid"] == server, (done, server)
        assert done["redis"] is False, done
        # a running job's child is found under it; PDEATHSIG chains child → server → supervisor
        jid = queue.enqueue("tests.lineage", 30).id
        [child] = wait_children(sup.pid, 1)
        assert psutil.Process(child).ppid() == server
        wait_for(lambda: queue.get(jid).state == "active", timeout=10, message="job active")
        sup.kill()  # SIGKILL: the supervisor can do nothing itself
        wait_for(lambda: gone(server), timeout=5, message="the fork server to die with it")
        wait_for(lambda: gone(child), timeout=5, message="the job's child to die too")
    finally:
        sup.kill()
    assert "Traceback" not in sup.log(), sup.log()[-4000:]


@pytest.mark.timeout(60)
def test_fork_server_crash_is_survived(tmp_path, redis_url, queue):
    sup = start(tmp_path, redis_url, queue, concurrency=2, lease_ttl="30s",
                reaper_interval="5s")
    try:
        server = the_fork_server(sup)
        jid = queue.enqueue("examples.sleep", 30, max_crashes=3).id
        [child] = wait_children(sup.pid, 1)
        wait_for(lambda: queue.get(jid).state == "active", timeout=10, message="job active")
        os.kill(server, signal.SIGKILL)
        wait_for(lambda: f"fork server {server} lost" in sup.log(), timeout=10,
                 message="the supervisor to log the lost fork server")
        wait_for(lambda: gone(child), timeout=5, message="its child to die with it")
        new = wait_for(lambda: [p for p in fork_servers_of(sup.pid) if p != server],
                       timeout=10, message="a new fork server")[0]
        assert server not in fork_servers_of(sup.pid)
        # the running job ended as a crash and runs again, under the new fork server
        second = wait_for(lambda: [p for p in children_of(sup.pid) if p != child],
                          timeout=10, message="the job to run again")[0]
        assert psutil.Process(second).ppid() == new
        job = queue.get(jid)
        assert job.state == "active", job.history
        assert job.crashes == 1, job.history
        assert [h["event"] for h in job.history][:3] == ["enqueued", "claimed", "crashed"]
        assert job.history[2]["reason"].startswith(
            "its fork server was lost (it ended: killed by SIGKILL): killed by SIGKILL"), \
            job.history[2]
        assert sup.proc.poll() is None
        queue.cancel(jid)
        # and it keeps processing jobs
        results = [queue.enqueue("tests.lineage") for _ in range(5)]
        for job in results:
            assert job.wait(timeout=15)["ppid"] == new
    finally:
        sup.stop()
    log = sup.log()
    assert "Traceback" not in log, log[-4000:]
    assert f"fork server {server} lost" in log


@pytest.mark.timeout(60)
def test_reload_with_new_imports_replaces_the_fork_server_and_keeps_running_jobs(
        tmp_path, redis_url, queue):
    sup = start(tmp_path, redis_url, queue, concurrency=2)
    try:
        old = the_fork_server(sup)
        jid = queue.enqueue("tests.lineage", 2.0).id
        wait_children(sup.pid, 1)
        write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2}, drain_timeout="2s",
                     imports=("forq.examples", "tests.tasks", "json"))
        sup.signal(signal.SIGHUP)
        new = wait_for(lambda: [p for p in fork_servers_of(sup.pid) if p != old], timeout=10,
                       message="a new fork server")[0]
        assert queue.enqueue("tests.lineage").wait(timeout=10)["ppid"] == new
        # the old one forked the running job and stays until it ends
        done = queue.get(jid)
        assert done.state == "active", done.history
        wait_for(lambda: queue.get(jid).state == "succeeded", timeout=10, message="old job done")
        job = queue.get(jid)
        assert job.result["ppid"] == old, job.result
        wait_for(lambda: gone(old), timeout=5, message="the old fork server to stop")
    finally:
        sup.stop()
    assert "Traceback" not in sup.log()


def test_a_slow_new_fork_server_does_not_cost_running_jobs_their_leases(tmp_path, redis_url,
                                                                      queue):
    """Starting a fork server blocks the supervisor's loop until its handler modules are
    imported; the leases of the running jobs are extended meanwhile."""
    sup = start(tmp_path, redis_url, queue)
    try:
        jid = queue.enqueue("tests.lineage", 5.0).id
        wait_children(sup.pid, 1)
        write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1}, drain_timeout="2s",
                     imports=("forq.examples", "tests.tasks", "tests.slow_import"))
        sup.signal(signal.SIGHUP)
        wait_for(lambda: "reloaded" in sup.log(), timeout=20, message="the reload")
        wait_for(lambda: queue.get(jid).state == "succeeded", timeout=20, message="the job")
        job = queue.get(jid)
        assert [e["event"] for e in job.history] == ["enqueued", "claimed", "succeeded"], \
            job.history  # one run: never reclaimed while the new fork server imported
    finally:
        sup.stop()
    assert "lease lost" not in sup.log() and "Traceback" not in sup.log()


@pytest.mark.timeout(60)
def test_fork_server_off_starts_each_child_alone(tmp_path, redis_url, queue):
    """Exec'd, not forked: the child holds none of the supervisor's memory, and imports
    the handler modules itself (redis is among its modules only if a handler imports it)."""
    sup = start(tmp_path, redis_url, queue, supervisor_extra="fork_server = false")
    try:
        done = queue.enqueue("tests.lineage").wait(timeout=10)
        assert done["ppid"] == sup.pid and done["redis"] is False, done
        job = queue.enqueue("tests.nope")
        assert wait_job(queue, job.id, ("dead",)).error["type"] == "UnknownTask"
        assert not fork_servers_of(sup.pid)
    finally:
        sup.stop()
    assert "Traceback" not in sup.log()
    assert "fork server" not in sup.log()


@pytest.mark.timeout(60)
def test_a_fork_server_that_cannot_start_leaves_children_started_alone(tmp_path, redis_url,
                                                                        queue):
    sup = start(tmp_path, redis_url, queue,
                imports=("forq.examples", "tests.tasks", "tests.fs_poison"))
    try:
        assert queue.enqueue("tests.lineage").wait(timeout=10)["ppid"] == sup.pid
        assert not fork_servers_of(sup.pid)
    finally:
        sup.stop()
    assert "fork server did not start" in sup.log(), sup.log()


@pytest.mark.timeout(60)
def test_a_fork_server_that_stops_answering_is_replaced(tmp_path, redis_url, queue):
    """A fork request waits at most REPLY_TIMEOUT for its answer (the loop waits with
    it); then the fork server is killed, a new one started, and the job forked there."""
    sup = start(tmp_path, redis_url, queue, lease_ttl="30s")
    try:
        server = the_fork_server(sup)
        os.kill(server, signal.SIGSTOP)
        job = queue.enqueue("tests.lineage")
        done = job.wait(timeout=20)
        assert f"fork server {server} lost (no answer in {REPLY_TIMEOUT:g}s)" in sup.log()
        new = the_fork_server(sup)
        assert new != server and done["ppid"] == new, (done, server, new)
        wait_for(lambda: gone(server), timeout=5, message="the silent fork server killed")
        assert queue.get(job.id).crashes == 0  # never forked: nothing crashed
    finally:
        sup.stop()
    assert "Traceback" not in sup.log()


@pytest.mark.timeout(60)
def test_a_fork_server_that_keeps_dying_is_given_up(tmp_path, redis_url, queue):
    """Lost more than 5 times in a minute: each job's child is started alone (exec'd by
    the supervisor, never a fork of it)."""
    sup = start(tmp_path, redis_url, queue)
    try:
        killed: list[int] = []
        for _ in range(6):
            server = int(wait_for(  # started, not merely starting
                lambda: [p for p in re.findall(r"fork server started in pid (\d+)", sup.log())
                         if int(p) not in killed], timeout=10, message="a new fork server")[0])
            os.kill(server, signal.SIGKILL)
            killed.append(server)
            wait_for(lambda s=server: f"fork server {s} lost" in sup.log(), timeout=10,
                     message=f"fork server {server} lost")
        wait_for(lambda: "lost 6 times in a minute: starting each job's child alone"
                 in sup.log(), timeout=10, message="the supervisor to give up")
        assert not [p for p in fork_servers_of(sup.pid) if p not in killed]
        assert queue.enqueue("tests.lineage").wait(timeout=10)["ppid"] == sup.pid
    finally:
        sup.stop()
    assert "Traceback" not in sup.log()
