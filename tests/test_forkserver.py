"""The fork server: job children are forked by a lean helper process, not by the
37 MiB supervisor. It must be small (no redis), die with its supervisor, be survived
when it crashes, be replaced on a reload that changes `imports`, and be optional. It
keeps spare children forked in advance: a job starts in one without waiting for a fork."""

from __future__ import annotations

import os
import re
import signal
import time

import psutil
import pytest

from forq import Queue
from forq.supervisor.fork.client import REPLY_TIMEOUT
from forq.testing.redis import delete_queue
from tests.helpers import gone, wait_for, wait_job
from tests.supervisors import (
    TEST_IMPORTS,
    SupervisorProcess,
    children_of,
    fork_servers_of,
    spares_of,
    wait_children,
    write_config,
)


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
        # it serves once it has imported the handler modules: the reload is done then
        wait_for(lambda: "reloaded" in sup.log(), timeout=20, message="the reload")
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
def test_a_starved_fork_server_reads_the_deadlines_sent_meanwhile_before_fencing(
        tmp_path, redis_url, queue):
    """A fork server stopped past its child's fencing deadline, while its supervisor goes
    on extending the lease and sending new deadlines, kills nothing when it runs again:
    the newer deadline waits in its socket (a loaded VM starves one process, not all)."""
    from forq.store.keys import QueueKeys

    sup = start(tmp_path, redis_url, queue, lease_ttl="3s")  # a deadline 2.7 s on
    try:
        server = the_fork_server(sup)
        handle = queue.enqueue("tests.lineage", 7.0)
        jid = handle.id
        wait_children(sup.pid, 1)
        os.kill(server, signal.SIGSTOP)
        try:
            stopped_at = time.time()
            # the supervisor extends on (each second): the lease in Redis runs 2 s past
            # the last deadline the stopped server read, which is therefore behind it
            wait_for(lambda: (queue.redis.zscore(QueueKeys(queue.name).active, jid) or 0)
                     > (stopped_at + 5.0) * 1000, timeout=15, message="the lease extended")
        finally:
            os.kill(server, signal.SIGCONT)
        assert handle.wait(timeout=20)["ppid"] == server
        job = queue.get(jid)
        assert [e["event"] for e in job.history] == ["enqueued", "claimed", "succeeded"], \
            job.history
    finally:
        sup.stop()
    assert "not confirmed in time" not in sup.log(), sup.log()[-4000:]


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
        # an operator's reload starts afresh: a fork server serves again
        sup.signal(signal.SIGHUP)
        wait_for(lambda: "reloaded" in sup.log(), timeout=20, message="the reload")
        (server,) = fork_servers_of(sup.pid)
        assert queue.enqueue("tests.lineage").wait(timeout=10)["ppid"] == server
    finally:
        sup.stop()
    assert "Traceback" not in sup.log()


# -- spares: idle children forked in advance --------------------------------------------

def the_spares(sup: SupervisorProcess, count: int = 2, without: tuple[int, ...] = ()) -> set[int]:
    """Wait until the fork server keeps `count` spares, none of them in `without`."""
    return set(wait_for(
        lambda: (found if len(found := [p for p in spares_of(sup.pid) if p not in without])
                 == count else []), timeout=10, message=f"{count} spare(s)"))


def fds_of(pid: int) -> dict[int, str]:
    path = f"/proc/{pid}/fd"
    return {int(fd): os.readlink(f"{path}/{fd}") for fd in os.listdir(path)}


def errors_in(log: str) -> list[str]:
    return [line for line in log.splitlines()
            if " ERROR " in line or "WARNING" in line or "Traceback" in line]


@pytest.mark.timeout(60)
def test_a_job_starts_in_a_spare_forked_before_it_and_the_spare_is_replaced(tmp_path,
                                                                           redis_url, queue):
    sup = start(tmp_path, redis_url, queue, concurrency=2)
    try:
        server = the_fork_server(sup)
        spares = the_spares(sup)
        for spare in spares:
            assert psutil.Process(spare).ppid() == server
            # it holds nothing of any job, nor of its fork server: stdio, its own socket
            # and its fork server's pidfd (to check it is alive, `die_with_parent`)
            fds = fds_of(spare)
            assert len(fds) == 5 and {0, 1, 2} <= fds.keys(), fds
            assert sorted(target.split(":")[0] for fd, target in fds.items() if fd > 2) == [
                "anon_inode", "socket"], fds
            assert "anon_inode:[pidfd]" in fds.values(), fds
        done = queue.enqueue("tests.lineage").wait(timeout=10)
        # the job ran in a process that was alive, idle, before it was enqueued
        assert done["pid"] in spares and done["ppid"] == server, (done, spares)
        assert done["redis"] is False, done
        # and another took its place
        refilled = the_spares(sup)
        assert done["pid"] not in refilled and len(refilled - spares) == 1, (refilled, spares)
        # a job of its own session, as a freshly forked child has
        info = queue.enqueue("tests.open_fds").wait(timeout=10)
        assert info["pid"] in refilled, (info, refilled)
        assert info["sid"] == info["pid"] == info["pgid"], info
        assert info["fds"][:4] == [0, 1, 2, 3] and info["sockets"] == [3], info
    finally:
        sup.stop()
    assert not errors_in(sup.log()), sup.log()[-4000:]


@pytest.mark.timeout(60)
def test_a_spare_killed_while_idle_is_replaced_without_a_word(tmp_path, redis_url, queue):
    sup = start(tmp_path, redis_url, queue, concurrency=2)
    try:
        server = the_fork_server(sup)
        spares = the_spares(sup)
        victim = min(spares)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: gone(victim), timeout=5, message="the spare reaped")
        refilled = the_spares(sup, without=(victim,))
        assert victim not in refilled and spares - {victim} < refilled, (spares, refilled)
        assert fork_servers_of(sup.pid) == [server]  # not lost: a spare is no job
        done = queue.enqueue("tests.lineage").wait(timeout=10)
        assert done["pid"] in refilled, (done, refilled)
    finally:
        sup.stop()
    # the supervisor never knew it: no exit report, no crash, no error
    log = sup.log()
    assert not errors_in(log) and str(victim) not in log, log[-4000:]


@pytest.mark.timeout(60)
def test_idle_spares_die_with_the_supervisor(tmp_path, redis_url, queue):
    sup = start(tmp_path, redis_url, queue, concurrency=2)
    try:
        server = the_fork_server(sup)
        spares = the_spares(sup)
        sup.kill()  # SIGKILL: PDEATHSIG chains spare → fork server → supervisor
        wait_for(lambda: gone(server), timeout=5, message="the fork server to die with it")
        for spare in spares:
            wait_for(lambda s=spare: gone(s), timeout=5, message=f"spare {spare} to die too")
    finally:
        sup.kill()


@pytest.mark.timeout(60)
def test_a_single_slot_keeps_one_spare(tmp_path, redis_url, queue):
    sup = start(tmp_path, redis_url, queue, concurrency=1)
    try:
        the_fork_server(sup)
        spare = the_spares(sup, count=1)
        assert queue.enqueue("tests.lineage").wait(timeout=10)["pid"] in spare
        the_spares(sup, count=1, without=tuple(spare))
    finally:
        sup.stop()


@pytest.mark.timeout(60)
def test_no_spare_is_forked_while_a_job_runs(tmp_path, redis_url, queue):
    """Spares are for an idle fork server: while a job runs, each page the fork server
    writes would be copied for a spare too (Spares.refill)."""
    sup = start(tmp_path, redis_url, queue, concurrency=2)
    try:
        spares = the_spares(sup)
        job = queue.enqueue("tests.lineage", 3)
        wait_for(lambda: queue.get(job.id).state == "active", timeout=10, message="running")
        quick = queue.enqueue("tests.lineage").wait(timeout=10)
        assert quick["pid"] in spares
        # both spares taken, the first job still running: its fork server has reaped the
        # second (before the supervisor acked it) and forked no spare since
        assert queue.get(job.id).state == "active"
        assert spares_of(sup.pid) == [], spares_of(sup.pid)
        job.wait(timeout=10)
        the_spares(sup, without=tuple(spares))  # idle again: refilled
    finally:
        sup.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["large", "namespaces"])
def test_a_job_a_spare_cannot_take_is_forked_for_it(tmp_path, redis_url, queue, kind):
    """A spec too large for one datagram (it comes in a memfd), or a job in namespaces of
    its own (forked as its namespaces need): forked then, the spares left as they were."""
    extra = "[sandbox]\nnamespaces = true\n" if kind == "namespaces" else ""
    sup = start(tmp_path, redis_url, queue, concurrency=2, extra=extra)
    try:
        spares = the_spares(sup)
        ballast = "x" * (100_000 if kind == "large" else 0)
        done = queue.enqueue("tests.lineage", kwargs={"ballast": ballast}).wait(timeout=10)
        if kind == "namespaces":
            assert done["pid"] == 1, done  # PID 1 of its own PID namespace
        else:
            assert done["pid"] not in spares and done["ppid"] == the_fork_server(sup), done
        assert set(spares_of(sup.pid)) == spares
    finally:
        sup.stop()
    assert not errors_in(sup.log()), sup.log()[-4000:]


@pytest.mark.timeout(60)
def test_a_spare_runs_only_a_job_of_the_priority_it_preset(tmp_path, redis_url, queue):
    """A spare sets its nice and oom_score_adj while it waits (those of the last job, the
    defaults before any). A job of another queue's nice is forked for it, with its own
    nice, and the spares forked next preset that one; each job has its queue's nice."""
    other = Queue(f"{queue.name}-nice3", redis=queue.redis)
    extra = f'[[queue]]\nname = "{other.name}"\nconcurrency = 2\nnice = 3\n'
    sup = start(tmp_path, redis_url, queue, concurrency=2, extra=extra)
    try:
        spares = the_spares(sup)
        niced = other.enqueue("tests.lineage").wait(timeout=10)
        assert niced["nice"] == 3 and niced["pid"] not in spares, (niced, spares)
        respares = the_spares(sup, without=tuple(spares))  # those preset 10 went
        again = other.enqueue("tests.lineage").wait(timeout=10)
        assert again["nice"] == 3 and again["pid"] in respares, (again, respares)
        default = queue.enqueue("tests.lineage").wait(timeout=10)
        assert default["nice"] == 10 and default["pid"] not in respares, (default, respares)
        seen = queue.enqueue("tests.whoami").wait(timeout=10)
        assert seen["oom_score_adj"] == 800, seen
    finally:
        sup.stop()
        delete_queue(other.redis, other.name)
    assert not errors_in(sup.log()), sup.log()[-4000:]


@pytest.mark.timeout(60)
def test_a_retired_fork_server_lets_its_spares_go_at_once(tmp_path, redis_url, queue):
    sup = start(tmp_path, redis_url, queue, concurrency=2)
    try:
        old = the_fork_server(sup)
        old_spares = the_spares(sup)
        jid = queue.enqueue("tests.lineage", 30).id
        [child] = wait_children(sup.pid, 1)
        write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2}, drain_timeout="2s",
                     imports=("forq.examples", "tests.tasks", "json"))
        sup.signal(signal.SIGHUP)
        # it serves once it has imported the handler modules: the reload is done then
        wait_for(lambda: "reloaded" in sup.log(), timeout=20, message="the reload")
        new = wait_for(lambda: [p for p in fork_servers_of(sup.pid) if p != old], timeout=10,
                       message="a new fork server")[0]
        # the old one stays for its running job, without spares
        for spare in old_spares - {child}:
            wait_for(lambda s=spare: gone(s), timeout=5, message=f"old spare {spare} to go")
        # and reaped them (a zombie is `gone` before its fork server has reaped it)
        wait_for(lambda: [c.pid for c in psutil.Process(old).children()] == [child],
                 timeout=5, message="the old fork server left with its running job alone")
        new_spares = the_spares(sup, without=tuple(old_spares))
        assert all(psutil.Process(p).ppid() == new for p in new_spares)
        queue.cancel(jid)
        wait_for(lambda: gone(old), timeout=10, message="the old fork server to stop")
    finally:
        sup.stop()
    assert "Traceback" not in sup.log()


# -- lean forks (supervisor/fork/leanfork.py) ------------------------------------------


@pytest.mark.timeout(60)
def test_each_job_draws_its_own_random_numbers(tmp_path, redis_url, queue):
    """A lean fork skips random's at-fork reseed: the child reseeds it, or every job
    would start from the fork server's state and draw the same numbers."""
    sup = start(tmp_path, redis_url, queue)
    try:
        draws = [queue.enqueue("tests.random_draw").wait(timeout=10) for _ in range(3)]
        assert len(set(draws)) == 3, draws
    finally:
        sup.stop()


@pytest.mark.timeout(60)
def test_an_at_fork_hook_of_a_handler_module_runs_in_its_jobs(tmp_path, redis_url, queue):
    """A hook the lean fork would skip (a library restarting its thread in the child,
    say) makes the fork server fork with os.fork(), which runs it."""
    sup = start(tmp_path, redis_url, queue, imports=(*TEST_IMPORTS, "tests.fork_hooks"))
    try:
        assert queue.enqueue("tests.fork_hook_ran").wait(timeout=10) is True
        assert queue.enqueue("tests.fork_hook_ran").wait(timeout=10) is True
    finally:
        sup.stop()


@pytest.mark.timeout(60)
def test_a_thread_started_by_a_handler_module_is_not_in_its_jobs(tmp_path, redis_url, queue):
    """With a second thread in the fork server, its children need threading's at-fork
    clean-up (or they list a thread that is not there, and a join would hang)."""
    sup = start(tmp_path, redis_url, queue, imports=(*TEST_IMPORTS, "tests.import_thread"))
    try:
        assert queue.enqueue("tests.threads").wait(timeout=10) == 1
    finally:
        sup.stop()


_LEAN_PROBE = """
import json, os, threading
registered = []
register = os.register_at_fork
os.register_at_fork = lambda **hooks: (registered.extend(
    getattr(h, "__module__", None) or type(h).__module__ for h in hooks.values()),
    register(**hooks))[-1]
import forq.supervisor.fork.server
from forq.supervisor.fork import leanfork
os.register_at_fork = register
print(json.dumps(sorted(set(registered))))
print(repr(leanfork.blocker()))
leanfork.watch_registrations()
print(repr(leanfork.blocker()))
pid = leanfork.fork()
if pid == 0:
    os._exit(7)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
import concurrent.futures.thread  # its shutdown lock's acquire, re-make and release
print(repr(leanfork.blocker()))
thread = threading.Thread(target=threading.Event().wait, daemon=True)
thread.start()
print(repr(leanfork.blocker()))
os.register_at_fork(after_in_child=lambda: None)
print(repr(leanfork.blocker()))
"""
_LOCK_PROBE = """
import os, threading
from forq.supervisor.fork import leanfork
leanfork.watch_registrations()
os.register_at_fork(before=threading.RLock().acquire)
print(repr(leanfork.blocker()))
os.register_at_fork(before=threading.Lock().locked)  # not one that guards a lock
print(repr(leanfork.blocker()))
"""


@pytest.mark.timeout(60)
def test_the_lean_fork_is_taken_only_when_the_skipped_hooks_have_nothing_to_do():
    """In a fresh process that imports the fork server as it starts: its own imports
    register only hooks a lean fork may skip, so it forks lean, and still after a
    module whose hooks only guard a lock (concurrent.futures); a second thread, or a
    hook it has not vetted, and it does not."""
    import json
    import subprocess
    import sys

    from forq.supervisor.fork import leanfork

    if leanfork._LIBC_FORK is None:
        pytest.skip(f"no lean fork on this Python: {leanfork.blocker()}")
    out = subprocess.run([sys.executable, "-c", _LEAN_PROBE], capture_output=True, text=True,
                         timeout=30, check=True).stdout.splitlines()
    from forq.supervisor.fork.leanfork import _SKIPPABLE

    assert set(json.loads(out[0])) <= _SKIPPABLE, out[0]
    assert out[1] == "'at-fork registrations not watched'"
    assert out[2] == "''", out
    assert out[3] == "7"  # a lean-forked child runs and exits as any other
    assert out[4] == "''", out  # concurrent.futures.thread's lock hooks are skippable
    assert out[5] == "'2 threads'", out
    assert out[6].startswith("'an at-fork hook of __main__."), out
    out = subprocess.run([sys.executable, "-c", _LOCK_PROBE], capture_output=True, text=True,
                         timeout=30, check=True).stdout.splitlines()
    assert out == ["''", "'an at-fork hook of builtins.lock.locked'"], out


@pytest.mark.timeout(60)
def test_a_service_variable_set_by_a_handler_module_is_not_in_its_jobs(tmp_path, redis_url,
                                                                       queue):
    """The fork server was started without systemd's per-service variables; one that a
    handler module sets at import is removed once, before the first fork."""
    sup = start(tmp_path, redis_url, queue, imports=(*TEST_IMPORTS, "tests.sets_service_vars"))
    try:
        assert queue.enqueue("tests.open_fds").wait(timeout=10)["env_notify"] is None
    finally:
        sup.stop()


def test_a_fork_reply_s_pid_is_the_kernel_s_word_for_its_pidfd():
    """The supervisor names a child by what its pidfd says, not by the reply's pid: the
    pidfd of a live child reads as its pid; an fd that is no pidfd, or no fd, is refused."""
    from forq.supervisor.fork.client import pid_of

    child = os.fork()
    if child == 0:
        os.pause()
        os._exit(0)
    pidfd = os.pidfd_open(child)
    read_end, write_end = os.pipe()
    try:
        assert pid_of(pidfd) == child
        with pytest.raises(OSError, match="not a pidfd"):
            pid_of(read_end)
        os.close(write_end)
        with pytest.raises(OSError):
            pid_of(write_end)  # closed: no such fd
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        for fd in (pidfd, read_end):
            os.close(fd)
