"""The supervisor's decision logic, in process and fast: its parts are built here with
a real Redis and real processes, but no supervisor process around them. The
black-box tests (test_supervisor_*.py) run the same logic in real supervisors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from redis import Redis

from forq.supervisor.children.outcomes import FailMode, Kind, Outcome
from forq.supervisor.children.running import KillReason, RunningChild
from forq.supervisor.config.load import load_config
from forq.supervisor.fork.child import ChildSpec
from forq.supervisor.leases.calls import leasing
from forq.supervisor.leases.fencing import Fencer
from forq.supervisor.leases.held import AUTO_SHORT, AUTO_STREAK, ShortJobs
from forq.supervisor.leases.keeper import LeaseKeeper
from forq.supervisor.loop.eventloop import EventLoop
from forq.supervisor.loop.timers import Timers
from forq.supervisor.loop.wakeups import Wakeups
from forq.supervisor.observe.metrics import Metrics
from forq.supervisor.redis_io.health import BACKOFF_MAX, BACKOFF_MIN, RedisHealth
from forq.supervisor.redis_io.reports import Pending, Reporter
from forq.supervisor.supervisor import Supervisor
from forq.testing.waiting import wait_for
from tests.supervisors import write_config

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lease_of(queue, task="tests.echo", **options):
    queue.enqueue(task, **options)
    [lease] = leasing(queue).claim("test-owner", 1, 30000).leases
    return lease


def child_of(lease, pid=0, queue="q") -> RunningChild:
    """The parent's record of a child; pid 0: never forked (as for an unknown task)."""
    spec = ChildSpec(job_id=lease.id, queue=queue, task=lease.job.task, args=[], kwargs={},
                     attempts=0, crashes=0, memory_limit=0, max_result_bytes=1 << 20)
    return RunningChild(lease, spec, pid, -1, -1, time.monotonic(), time.monotonic() + 60)


# -- RedisHealth -------------------------------------------------------------------------

def test_auto_prefetch_holds_jobs_only_after_a_streak_of_short_ones():
    short = ShortJobs()
    short.configure(["auto"])
    assert short.prefetch("fixed", 3) == 3  # a number is a number, whatever the jobs
    for _ in range(AUTO_STREAK - 1):
        short.ended("auto", AUTO_SHORT / 2)
        short.ended("fixed", 60.0)
    assert short.prefetch("auto", 4) == 0  # not yet: a streak of AUTO_STREAK
    short.ended("auto", AUTO_SHORT)
    assert short.prefetch("auto", 4) == 4
    short.ended("auto", 0.3)  # one job of 300 ms: none held behind the next one
    assert short.prefetch("auto", 4) == 0
    assert short.prefetch("fixed", 3) == 3
    short.configure([])  # a reload to a number
    assert short.prefetch("auto", 2) == 2


def test_redis_health_backs_off_doubling_to_a_cap_and_resets_when_redis_answers():
    clock, errors = Clock(), []
    health = RedisHealth(errors.append, clock=clock)
    assert health.ready()
    delays = []
    for _ in range(10):
        health.failed("claim", OSError("down"))
        delays.append(health.down_until - clock.now)
        assert not health.ready()
    assert delays[0] == pytest.approx(BACKOFF_MIN)
    assert delays[1] == pytest.approx(2 * BACKOFF_MIN)
    assert max(delays) == pytest.approx(BACKOFF_MAX)
    assert errors == ["claim"] * 10
    clock.now += BACKOFF_MAX
    assert health.ready()
    assert health.worked() is True  # it had been failing
    assert health.worked() is False
    health.failed("extend", OSError())
    assert health.down_until - clock.now == pytest.approx(BACKOFF_MIN)


# -- LeaseKeeper and Fencer ---------------------------------------------------------------

def test_a_lease_is_proven_for_its_ttl_from_the_sending_of_its_last_confirmed_extension(
        queue, r):
    keeper = LeaseKeeper(lease_ttl=10.0)
    lease = lease_of(queue)
    sent = time.monotonic()
    keeper.add(queue.name, lease.id, lease.token, sent)
    assert keeper.unproven(now=sent + 8.9) == []
    assert keeper.unproven(now=sent + 9.0) == [lease.id]  # the safety margin: ttl/10
    lost, cancelled = keeper.extend(r, {queue.name: queue})
    assert (lost, cancelled) == ([], [])
    assert keeper.unproven(now=sent + 9.0) == []  # proven again from the extension
    queue.cancel(lease.id)
    assert keeper.extend(r, {queue.name: queue}) == ([], [lease.id])


def test_the_fencer_kills_a_child_whose_lease_is_lost_or_unproven():
    procs = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(2)]
    try:
        keeper = LeaseKeeper(lease_ttl=1.0)
        children = {}
        for n, proc in enumerate(procs):
            lease = type("L", (), {"id": f"j{n}", "token": "t", "job": type(
                "J", (), {"task": "x", "id": f"j{n}"})()})()
            children[lease.id] = child_of(lease, pid=proc.pid)
        keeper.add("q", "j1", "t", time.monotonic() - 5)  # proof long gone
        fencer = Fencer(keeper, children)
        fencer.lost(["j0", "unknown-job"])
        fencer.unproven()
        for proc in procs:
            assert proc.wait(timeout=5) == -signal.SIGKILL
        assert children["j0"].kill_reason is KillReason.LEASE_LOST
        assert children["j1"].kill_reason is KillReason.LEASE_LOST
        assert len(keeper) == 0  # an unproven lease is forgotten
    finally:
        for proc in procs:
            proc.kill()


# -- Reporter ----------------------------------------------------------------------------

def test_the_reporter_acks_with_the_current_token_and_drops_a_stale_one(queue, r):
    keeper = LeaseKeeper(lease_ttl=30.0)
    reporter = Reporter(lambda name: queue, keeper, Metrics(name="t"))
    lease = lease_of(queue)
    keeper.add(queue.name, lease.id, lease.token, time.monotonic())
    item = Pending(child_of(lease, queue=queue.name), Outcome(Kind.ACK, "succeeded",
                                                              result_json='{"a":1}'), lease.token)
    for expected in ("succeeded", "lease_lost"):  # the same report twice: the second is stale
        pipe = r.pipeline(transaction=False)
        reporter.send(pipe, item)
        assert reporter.answered(item, pipe.execute(raise_on_error=False)) == expected
    assert queue.get(lease.id).result == {"a": 1}
    assert len(keeper) == 0


def test_the_reporter_says_whether_a_failure_was_retried_or_dead(queue, r):
    reporter = Reporter(lambda name: queue, LeaseKeeper(30.0), Metrics(name="t"))
    for mode, max_attempts, expected in ((FailMode.RETRY, 3, "retried"),
                                         (FailMode.RETRY, 1, "dead"),
                                         (FailMode.FATAL, 3, "dead")):
        lease = lease_of(queue, max_attempts=max_attempts)
        outcome = Outcome(Kind.FAIL, "failed", mode=mode, reason="boom",
                          error={"type": "ValueError", "message": "boom", "reason": "boom"})
        item = Pending(child_of(lease, queue=queue.name), outcome, lease.token)
        pipe = r.pipeline(transaction=False)
        reporter.send(pipe, item)
        assert reporter.answered(item, pipe.execute(raise_on_error=False)) == expected


def test_the_reporter_sends_a_turns_acks_in_one_call_each_answered_alone(queue, r):
    keeper = LeaseKeeper(30.0)
    reporter = Reporter(lambda name: queue, keeper, Metrics(name="t"))
    items = []
    for n in range(3):
        lease = lease_of(queue)
        token = "stale" if n == 1 else lease.token
        items.append(Pending(child_of(lease, queue=queue.name),
                             Outcome(Kind.ACK, "succeeded", result_json=str(n)), token))
    pipe = r.pipeline(transaction=False)
    spans = reporter.send_batch(pipe, items)
    assert len(pipe.command_stack) == 1  # one ack call for the three
    seen = []
    reporter.answered = lambda item, replies: seen.append((item.token, replies[-1]))
    reporter.answer_batch(items, spans, pipe.execute(raise_on_error=False))
    assert [answer for _, answer in seen] == ["ok", "lost", "ok"]
    assert queue.get(items[2].child.job_id).fields["result"] == "2"


# -- LimitPolice ---------------------------------------------------------------------------

def test_memory_samples_per_tick_are_capped_and_every_child_gets_its_turn(queue):
    from forq.supervisor.isolation.limits import SAMPLES_PER_TICK, LimitPolice

    lease = lease_of(queue)
    procs = [subprocess.Popen(["sleep", "30"]) for _ in range(SAMPLES_PER_TICK + 36)]
    try:
        children = [child_of(lease, pid=p.pid) for p in procs]
        police = LimitPolice(lambda child: None)
        police.tick(children)
        assert sum(1 for c in children if c.peak_rss > 0) == SAMPLES_PER_TICK
        police.tick(children)
        assert all(c.peak_rss > 0 for c in children)
    finally:
        for p in procs:
            p.kill()
            p.wait()


# -- Timers, EventLoop, Wakeups ---------------------------------------------------------

def test_timers_run_in_due_order_and_a_cancelled_one_never_runs():
    timers, ran = Timers(), []
    timers.schedule(0.002, lambda: ran.append("b"))
    timers.schedule(0.0, lambda: ran.append("a"))
    dead = timers.schedule(0.001, lambda: ran.append("never"))
    timers.cancel(dead)
    deadline = time.monotonic() + 2
    while len(ran) < 2 and time.monotonic() < deadline:
        time.sleep(timers.timeout(0.01))
        timers.run_due()
    assert ran == ["a", "b"]
    assert timers.timeout(5.0) == 5.0


def test_a_periodic_timer_is_rearmed_even_when_its_callback_raises():
    timers, ran = Timers(), []

    def tick() -> None:
        ran.append(time.monotonic())
        if len(ran) == 1:
            raise RuntimeError("first tick fails")

    timers.every(0.001, tick)
    deadline = time.monotonic() + 2
    while len(ran) < 3 and time.monotonic() < deadline:
        time.sleep(timers.timeout(0.01))
        try:
            timers.run_due()
        except RuntimeError:
            pass
    assert len(ran) >= 3


def test_the_event_loop_delivers_a_real_signal_between_events():
    loop, got = EventLoop(), []
    try:
        loop.watch_signals([signal.SIGUSR1], got.append)
        signal.raise_signal(signal.SIGUSR1)
        loop.run_once(cap=1.0)
        assert got == [signal.SIGUSR1]
    finally:
        loop.close()


def test_a_wake_message_claims_now_or_arms_one_timer_per_queue(r):
    loop, woken = EventLoop(), []
    try:
        wakeups = Wakeups(loop, r, RedisHealth(), lambda: woken.append(1))
        wakeups.on_message("forq:{q1}:wake", "0")
        assert woken == [1]
        later = (time.time() + 1.0) * 1000
        wakeups.on_message("forq:{q1}:wake", str(later))
        wakeups.on_message("forq:{q1}:wake", str(later + 5000))  # later: the first wins
        wakeups.on_message("forq:{q1}:wake", "garbage")  # from an untrusted writer: claim
        assert woken == [1, 1] and list(wakeups.timers) == ["q1"]
        timer, due = wakeups.timers["q1"]
        assert due - time.monotonic() < 1.1
    finally:
        loop.close()


# -- a Supervisor, in process ------------------------------------------------------------

def test_a_drain_waits_for_children_and_reports_then_a_second_signal_stops_them(tmp_path,
                                                                              redis_url, queue):
    config = load_config(write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2}))
    sup = Supervisor(config)
    try:
        drain, stopped = sup.drain, []
        assert not drain.finished(0, 30.0)  # not draining: never finished
        sup.children.stop_all = stopped.append  # type: ignore[method-assign]
        drain.signal(signal.SIGTERM, 30.0, "status")
        assert drain.active and not sup.spawner.accepting and stopped == []
        assert drain.finished(0, 30.0)  # no child, every report sent
        assert not drain.finished(3, 30.0)  # reports still to send, within the grace
        drain.started -= 30.0 + 16.0  # past the drain timeout and the report grace
        assert drain.finished(3, 30.0)  # given up: those leases expire and are reclaimed
        drain.signal(signal.SIGINT, 30.0, "status")
        assert stopped == ["second signal"]
    finally:
        sup.loop.close()


def test_a_failed_lease_extension_is_retried_soon_not_a_period_later(tmp_path, redis_url,
                                                                    queue):
    config = load_config(write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2},
                                      lease_ttl="2s"))
    sup = Supervisor(config)
    try:
        queue.enqueue("tests.echo", 1)
        [lease] = leasing(queue).claim(sup.id, 1, 2000).leases
        sup.leases.add(queue.name, lease.id, lease.token, time.monotonic())
        before = sup.leases.proven_until(lease.id)
        sup.renewal.client = Redis.from_url("redis://127.0.0.1:1/0")  # nothing listens
        sup.renewal.extend()
        assert sup.renewal.retrying and not sup.health.ready()
        due = sup.loop.timers.timeout(10.0)
        assert due <= 0.25  # the retry, not lease_ttl/3 later
        sup.renewal.client = sup.redis
        deadline = time.monotonic() + 2
        while sup.renewal.retrying and time.monotonic() < deadline:
            sup.loop.run_once(cap=0.05)
        assert not sup.renewal.retrying
        assert sup.leases.proven_until(lease.id) > before  # the retry extended it
    finally:
        sup.loop.close()


def test_one_sync_claims_and_reports_an_unknown_task_dead_without_forking(tmp_path,
                                                                          redis_url, queue):
    config = load_config(write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2}))
    sup = Supervisor(config)
    try:
        assert sup._start_forking()  # the fork server tells which tasks exist
        job = queue.enqueue("no.such.task")
        sup._sync()  # claims it; the unknown task becomes a report at once
        assert len(sup.children) == 0 and len(sup.outbox) == 1
        sup._sync()  # reports it
        done = queue.get(job.id)
        assert done.state == "dead"
        assert "unknown task" in done.history[-1]["reason"]
    finally:
        sup.spawner.close()
        sup.loop.close()


def test_a_lease_that_ran_out_before_the_fork_gets_no_child_and_goes_back(tmp_path,
                                                                         redis_url, queue):
    """A supervisor stopped (SIGSTOP, a VM pause) between its claim and the fork must not
    start a child for a lease another supervisor may have reclaimed meanwhile."""
    config = load_config(write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2},
                                      lease_ttl="2s"))
    sup = Supervisor(config)
    try:
        job = queue.enqueue("tests.echo", 1)
        [lease] = leasing(queue).claim(sup.id, 1, 2000).leases
        sup.children.start(queue.name, lease, sent_at=time.monotonic() - 5)  # 5 s ago
        assert len(sup.children) == 0 and len(sup.outbox) == 1
        sup._sync()  # the release, fenced by the token
        back = queue.get(job.id)
        assert back.state == "pending" and back.attempts == 0 and back.crashes == 0
        assert back.history[-1]["event"] == "released"
    finally:
        sup.loop.close()


def test_a_held_tree_sample_counts_every_process_and_ends_with_its_root():
    """`RootFiles` (the memory sampler's held /proc files): the root, a grandchild
    started from a second thread, and their memory; None once the root is reaped —
    its pid may then be another process's, and a held file never answers for it."""
    import psutil

    from forq.supervisor.isolation.memory import RootFiles

    # the grandchild is the second thread's child: only that thread's children file
    # lists it (and the thread lives on, so it is not handed to the main thread)
    script = ("import subprocess, threading, time\n"
              "held = bytearray(40 << 20)\n"
              "for i in range(0, len(held), 4096): held[i] = 1\n"
              "ready = threading.Event()\n"
              "def run():\n"
              "    subprocess.Popen(['sleep', '30']); ready.set(); time.sleep(30)\n"
              "threading.Thread(target=run, daemon=True).start()\n"
              "ready.wait(); print('ready', flush=True); time.sleep(30)\n")
    root = subprocess.Popen(["python3", "-c", script], stdout=subprocess.PIPE)
    tree: list[psutil.Process] = []
    try:
        assert root.stdout.readline() == b"ready\n"
        files = RootFiles(root.pid)
        usage = files.usage()  # `sleep` runs: Popen returned once it was exec'd
        tree = [psutil.Process(root.pid), *psutil.Process(root.pid).children(recursive=True)]
        assert usage is not None and usage[0] == len(tree) == 2
        assert usage[1] >= 40 << 20
        assert abs(usage[1] - sum(p.memory_info().rss for p in tree)) < 4 << 20
        root.kill()
        root.wait(timeout=10)
        assert files.usage() is None
        files.close()
    finally:
        root.kill()
        for process in tree[1:]:  # reparented by now: psutil would call it another
            _kill_orphan(process.pid)



def test_a_held_tree_tells_the_cpu_of_every_process_and_nothing_once_its_root_is_reaped():
    """`RootFiles.cpu` (the heartbeat's CPU figure for `forq top`, read through the held
    files): the root's time, a descendant's and what the root reaped, as a walk by
    path (`tree_cpu`) tells it; None once the root is reaped, never a stranger's."""
    from forq.supervisor.isolation.memory import RootFiles, tree_cpu

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
    script = ("import subprocess, sys, time\n"
              # a child that burned 0.2 s and was reaped: the root's cutime
              f"subprocess.run([sys.executable, '-c', {burn.format(s=0.2)!r}])\n"
              # a live one that burned 0.3 s and now sleeps
              f"live = subprocess.Popen([sys.executable, '-c', {burn.format(s=0.3)!r}"
              " + 'print(1, flush=True); time.sleep(30)'], stdout=subprocess.PIPE)\n"
              "live.stdout.readline(); print(live.pid, flush=True); time.sleep(30)\n")
    root = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    live = 0
    try:
        assert root.stdout is not None
        live = int(root.stdout.readline())
        files = RootFiles(root.pid)
        held, walked = files.cpu(), tree_cpu(root.pid)
        # 0.2 s reaped, 0.3 s live, and the interpreters' start-up
        assert held is not None and held >= 0.5, held
        assert abs(held - walked) < 0.05, (held, walked)
        root.kill()
        root.wait(timeout=10)
        assert files.cpu() is None
        files.close()
    finally:
        root.kill()
        root.wait(timeout=10)
        if live:  # reparented once its parent died: ours to end
            _kill_orphan(live)


def _kill_orphan(pid: int) -> None:
    """SIGKILL a test's process left behind by its killed parent, if it still runs."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _holder(mib: int) -> subprocess.Popen:
    """A process that holds `mib` MiB it touched, and says so once it has: its memory
    is then far above what any per-CPU lag of the kernel's counters could hide."""
    script = (f"held = bytearray({mib} << 20)\n"
              "for i in range(0, len(held), 4096): held[i] = 1\n"
              "print('ready', flush=True)\nimport time; time.sleep(30)\n")
    proc = subprocess.Popen(["python3", "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


class _NoFreeFds:
    """Every fd of this process in use but `spare` (RLIMIT_NOFILE lowered to 64 above
    the highest fd in use)."""

    def __init__(self, spare: int) -> None:
        import resource

        self.spare = spare
        self.limits = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.filler: list[int] = []

    def __enter__(self) -> _NoFreeFds:
        import errno
        import resource

        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 64, self.limits[1]))
        try:
            with pytest.raises(OSError) as full:
                while True:
                    self.filler.append(os.open("/dev/null", os.O_RDONLY))
            assert full.value.errno == errno.EMFILE
            for _ in range(self.spare):
                os.close(self.filler.pop())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        import resource

        for fd in self.filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, self.limits)


def _child_of(pid: int, memory_limit: int = 0) -> RunningChild:
    spec = ChildSpec(job_id="j1", queue="q", task="tests.echo", args=[], kwargs={},
                     attempts=0, crashes=0, memory_limit=memory_limit, max_result_bytes=1024)
    return RunningChild(None, spec, pid, -1, -1, 0.0, 0.0)  # type: ignore[arg-type]


def test_a_supervisor_out_of_fds_still_samples_a_childs_memory():
    """A low RLIMIT_NOFILE and many children: the sampler cannot hold a child's /proc
    files open, and reads them by path instead, rather than not sampling it. It read
    0 bytes for a live `sleep` under load once, from /proc/PID/stat's RSS, which lags
    the kernel's per-CPU counters: RSS comes from statm now (memory.py)."""
    holder = _holder(16)
    child = _child_of(holder.pid)
    try:
        with _NoFreeFds(spare=1):  # one free fd: a read by path, not held files
            usage = child.tree_usage()
            assert child.proc is None  # nothing held
        assert usage is not None and usage[0] == 1 and usage[1] >= 16 << 20, usage
    finally:
        holder.kill()
        holder.wait()
    child.close_proc()


def test_a_sample_that_cannot_be_taken_is_an_error_never_a_zero():
    """Not one free fd: no /proc file can be read, and the sample says so — it is not
    "one process using nothing", nor "exited"."""
    from forq.supervisor.isolation.memory import SampleError, tree_usage

    holder = _holder(16)
    child = _child_of(holder.pid)
    try:
        with _NoFreeFds(spare=0):
            with pytest.raises(SampleError, match="Too many open files"):
                tree_usage(holder.pid)
            with pytest.raises(SampleError, match="Too many open files"):
                child.tree_usage()
        assert child.tree_usage()[1] >= 16 << 20  # type: ignore[index]
    finally:
        holder.kill()
        holder.wait()
        child.close_proc()


def test_memory_backed_files_count_once_and_files_on_disk_not_at_all(tmp_path):
    """A memfd of 8 MiB held by a process and its child counts once; a file on disk and
    the process's other fds count nothing; an unmapped memfd is in no RSS."""
    from forq.supervisor.isolation.memory import SharedFiles, tree_usage

    script = ("import os, time\n"
              "fd = os.memfd_create('held')\n"
              "os.write(fd, b'x' * (8 << 20))\n"
              f"disk = open({str(tmp_path / 'on-disk')!r}, 'wb'); disk.write(b'y' * (4 << 20))\n"
              "disk.flush()\n"
              "if os.fork() == 0: time.sleep(30)\n"
              "print('ready', flush=True); time.sleep(30)\n")
    proc = subprocess.Popen(["python3", "-c", script], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        wait_for(lambda: tree_usage(proc.pid)[0] == 2, timeout=10, message="the child")

        def once() -> bool:
            # read twice: a child just forked still faults its parent's file pages in, so
            # RSS can grow between the two reads; a memfd counted twice or not at all
            # never fits, whatever RSS does
            nonlocal shared
            processes, resident = tree_usage(proc.pid)
            shared = SharedFiles()
            processes_too, total = tree_usage(proc.pid, shared)
            assert processes_too == processes == 2
            return abs(total - resident - (8 << 20)) < 1 << 20  # RSS and the memfd, once

        shared = SharedFiles()
        wait_for(once, timeout=10, message="RSS and the memfd counted once")
        assert shared.bytes == 8 << 20 and len(shared.seen) == 1, shared.seen
    finally:
        for pid in [proc.pid, *_children(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []
