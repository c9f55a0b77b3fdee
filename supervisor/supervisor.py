"""The supervisor: lease jobs, fork one child per job, keep the leases alive from the
parent, enforce limits, report every end, drain on SIGTERM.

Read it top to bottom as the life of a job: `_claim` leases jobs for free slots,
`_start` has a child forked (by the lean fork server, `_spawn`), `_extend_leases` keeps its lease (or fences it), `_sample_memory`
and the per-child timeout police its limits, `_on_child_exit` classifies its end, and
`_flush` reports it to Redis in one pipelined round trip with every other report.
"""

from __future__ import annotations

import gc
import importlib
import json
import logging
import os
import signal
import socket
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import redis

from forq import Queue, registry, topology
from forq.connection import connect
from forq.keys import QueueKeys
from forq.supervisor import cgroups, memory
from forq.supervisor.cgroups import JobCgroups
from forq.supervisor.config import Config, ConfigError, load_config
from forq.supervisor.fork.child import ChildSpec
from forq.supervisor.fork.client import ForkServer, ForkServerError, spawn
from forq.supervisor.leases import LeaseKeeper
from forq.supervisor.loop import EventLoop
from forq.supervisor.metrics import Metrics, MetricsServer
from forq.supervisor.outcomes import Outcome, classify
from forq.supervisor.registry import SupervisorRegistry
from forq.supervisor.running import (
    CANCELLED,
    LEASE_LOST,
    MEMORY,
    PROTOCOL,
    RELEASED,
    TIMEOUT,
    RunningChild,
)
from forq.supervisor.scheduler import Scheduler
from forq.supervisor.sdnotify import Notifier, watchdog_interval

log = logging.getLogger("forq.supervisor")

KILL_GRACE = 2.0  # SIGTERM → SIGKILL for time limits, drains and cancels
IDEMPOTENCY_TTL_MS = 24 * 3600 * 1000
POLL_INTERVAL = 2.0  # safety net if a wake message was lost while reconnecting
HEARTBEAT_INTERVAL = 2.0
REDIS_BACKOFF_MAX = 5.0
DRAIN_REPORT_GRACE = 15.0  # after drain, how long to keep retrying reports to Redis


@dataclass
class Pending:
    """A finished child's report waiting for Redis."""

    child: RunningChild
    outcome: Outcome
    token: str


class Supervisor:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.id = f"{socket.gethostname()}:{os.getpid()}"
        self.name = config.name
        self.loop = EventLoop()
        # short socket timeouts: a blocked call blocks lease keeping for every child
        timeout = max(0.2, min(2.0, config.lease_ttl / 4))
        self.redis = connect(config.redis_url, password=config.redis_password,
                             socket_timeout=timeout, socket_connect_timeout=timeout,
                             health_check_interval=0, retry_on_timeout=False)
        # [redis].min_replicas: a WAIT must end before the socket times out
        self.wait_ms = int(min(config.redis_wait_timeout, timeout * 0.8) * 1000)
        self.queues: dict[str, Queue] = {}
        self.policies: dict[str, str] = {}
        self.leases = LeaseKeeper(config.lease_ttl)
        self.children: dict[str, RunningChild] = {}  # by job id
        self.running: dict[str, int] = defaultdict(int)
        self.outbox: list[Pending] = []
        self.metrics = Metrics(self._read_depths, name=self.name)
        self.metrics_server: MetricsServer | None = None
        self.notifier = Notifier.from_env()
        self.registry = SupervisorRegistry(self.redis, self.id)
        self.pubsub: Any = None
        self.pubsub_sock: Any = None  # the socket registered in the selector for wakes
        self.draining = False
        self.drain_started = 0.0
        self.want_claim = True
        self.redis_down_until = 0.0
        self.redis_backoff = 0.1
        self.claim_timers: dict[str, Any] = {}
        self.extend_retry = False  # a quick retry of a failed extend is scheduled
        self.last_error_log = 0.0
        self.scheduler = Scheduler(config.schedules, self.redis, self._queue_for)
        # job children are forked by a lean fork server ([supervisor].fork_server);
        # old ones retire (after a reload that changed `imports`) once their children end
        self.fork_server: ForkServer | None = None
        self.retiring: list[ForkServer] = []
        self.fork_server_losses: list[float] = []  # monotonic times, for crash loops
        self.fork_server_given_up = False
        # per-job cgroup v2 memory limits, where this supervisor may create cgroups
        self.cgroups: JobCgroups | None = None
        self.cgroups_failed = False  # a child could not join its cgroup: no more of them
        self._apply_config(config)

    # -- configuration -------------------------------------------------------------

    def _apply_config(self, config: Config) -> None:
        self.config = config
        for qc in config.queues:
            if qc.name not in self.queues:
                self.queues[qc.name] = Queue(qc.name, redis=self.redis)
            self.policies[qc.name] = json.dumps(config.job_policy(qc.name))
            self.metrics.declare_queue(qc.name, qc.concurrency)

    def _served(self) -> list[str]:
        return [qc.name for qc in self.config.queues]

    def _push_limits(self) -> None:
        """Queues whose TOML sets a global limit get it at start and on reload;
        the others keep whatever `forq limit` set at run time."""
        for qc in self.config.queues:
            q = self.queues[qc.name]
            if qc.rate_limit is not None or qc.max_in_flight is not None:
                q.set_limits(rate=qc.rate_limit if qc.rate_limit is not None else False,
                             max_in_flight=qc.max_in_flight if qc.max_in_flight is not None
                             else False)
            self.redis.sadd("forq:queues", qc.name)

    def reload(self) -> None:
        try:
            config = load_config(self.config.path)
        except ConfigError as exc:
            log.error("reload refused, keeping the old config: %s", exc)
            return
        old = self.config
        self._apply_config(config)
        if (config.fork_server != old.fork_server
                or (config.fork_server and config.imports != old.imports)):
            self._retire_fork_server()
            self._start_fork_server()
        self.scheduler.replace(config.schedules)
        self._push_limits_safely()
        self._subscribe()
        self.want_claim = True
        log.info("reloaded %s: queues %s", config.path,
                 ", ".join(f"{q.name}×{q.concurrency}" for q in config.queues))

    def _push_limits_safely(self) -> None:
        try:
            self._push_limits()
        except (redis.RedisError, OSError) as exc:
            self._redis_failed("limits", exc)

    # -- start and stop ---------------------------------------------------------------

    def preload(self) -> None:
        """Import handler modules once, then freeze the heap: each child then starts
        with its handlers loaded, and its garbage collector never walks (and so never
        copies) the parent's objects."""
        for name in self.config.imports:
            importlib.import_module(name)
        gc.collect()
        gc.freeze()

    def run(self) -> int:
        try:  # before the fork server starts: it must live in the supervisor's own cgroup
            self.cgroups, memory_mode = cgroups.probe(self.config.job_cgroups)
        except cgroups.CgroupsUnavailable as exc:
            log.error("per-job cgroups unavailable: %s ([supervisor].job_cgroups = "
                      "\"required\" in %s)", exc, self.config.path)
            self.loop.close()
            return 1
        self.preload()
        self._start_fork_server()
        log.info("supervisor %s (%s) starting: queues %s; memory limits by %s",
                 self.name, self.id,
                 ", ".join(f"{q.name}×{q.concurrency}" for q in self.config.queues),
                 memory_mode)
        self.loop.watch_signals((signal.SIGTERM, signal.SIGINT, signal.SIGHUP), self._on_signal)
        self._wait_for_redis()
        if self.draining:
            return 0
        self._push_limits_safely()
        self._subscribe()
        if self.config.metrics_listen:
            host, port = self.config.metrics_listen
            try:
                self.metrics_server = MetricsServer(self.metrics, host, port)
            except OSError as exc:
                log.error("cannot serve metrics on %s:%d: %s ([metrics].listen in %s)",
                          host, port, exc.strerror or exc, self.config.path)
                self.loop.close()
                return 1
            self.metrics_server.register(self.loop.selector)
            log.info("metrics on http://%s:%d/metrics", *self.metrics_server.address)
        self._every(self.config.lease_ttl / 3, self._extend_leases)
        self._every(self.config.reaper_interval, self._reap)
        self._every(self.config.memory_sample_interval, self._police_children)
        self._every(HEARTBEAT_INTERVAL, self._heartbeat)
        self._every(POLL_INTERVAL, self._poll)
        interval = watchdog_interval()
        if interval:
            self._every(interval, self.notifier.watchdog)
        self.loop.timers.schedule(0, self._run_scheduler)
        self._heartbeat()
        self.notifier.ready(self._status())
        log.info("ready")
        while not self._finished():
            self._fence_unproven()
            if self.want_claim or self.outbox:
                self._sync()
            self.loop.run_once(cap=1.0)
        self._shutdown()
        return 0

    def _every(self, interval: float, fn: Any) -> None:
        def tick() -> None:
            try:
                fn()
            finally:
                self.loop.timers.schedule(interval, tick)

        self.loop.timers.schedule(interval, tick)

    def _wait_for_redis(self) -> None:
        delay = 0.1
        while not self.draining:
            try:
                self.redis.ping()
                return
            except (redis.RedisError, OSError) as exc:
                log.warning("redis not reachable yet (%s); retrying in %.1fs", exc, delay)
                self.loop.timers.schedule(delay, lambda: None)
                self.loop.run_once(cap=delay)
                delay = min(delay * 2, REDIS_BACKOFF_MAX)

    def _finished(self) -> bool:
        if not self.draining or self.children:
            return False
        if not self.outbox:
            return True
        # reports Redis will not take: their leases expire and are reclaimed instead
        return time.monotonic() - self.drain_started > self.config.drain_timeout + DRAIN_REPORT_GRACE

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGHUP:
            self.reload()
            return
        if not self.draining:
            self.draining = True
            self.drain_started = time.monotonic()
            log.info("%s: draining %d running job(s), up to %.0fs", signal.Signals(signum).name,
                     len(self.children), self.config.drain_timeout)
            self.notifier.stopping(self._status())
            self._unsubscribe()
            self.loop.timers.schedule(self.config.drain_timeout,
                                      lambda: self._stop_all("drain timeout"))
        else:
            log.info("%s again: stopping %d job(s) now", signal.Signals(signum).name,
                     len(self.children))
            self._stop_all("second signal")

    def _stop_all(self, why: str) -> None:
        for child in list(self.children.values()):
            child.stop(RELEASED, why, grace=KILL_GRACE)
            self._kill_after_grace(child)

    def _shutdown(self) -> None:
        try:
            self.registry.leave()
        except (redis.RedisError, OSError):
            pass
        self._unsubscribe()
        if self.metrics_server is not None:
            self.metrics_server.close()
        for server in [*self.retiring, self.fork_server]:
            if server is not None:
                self.loop.remove_reader(server.sock)
                server.close()
        self.fork_server, self.retiring = None, []
        if self.cgroups is not None:
            self.cgroups.sweep()
        self.loop.close()
        log.info("stopped")

    def _run_scheduler(self) -> None:
        """Fire due cron ticks, then sleep until the next one (re-armed every call)."""
        if self.draining:
            return
        delay = 1.0
        if self._redis_ready():
            try:
                delay = self.scheduler.fire_due()
            except (redis.RedisError, OSError) as exc:
                self._redis_failed("schedule", exc)
        self.loop.timers.schedule(delay + 0.002, self._run_scheduler)

    # -- waking up for work ------------------------------------------------------------

    def _subscribe(self) -> None:
        self._unsubscribe()
        if self.draining:
            return
        try:
            self.pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            self.pubsub.subscribe(*(QueueKeys(q).wake for q in self._served()))
            self.pubsub_sock = self.pubsub.connection._sock
            self.loop.add_reader(self.pubsub_sock, self._on_wake)
        except (redis.RedisError, OSError, AttributeError) as exc:
            self._redis_failed("subscribe", exc)
            self.pubsub = None

    def _unsubscribe(self) -> None:
        # unregister the socket we registered, even if redis-py has already closed and
        # dropped it after an error: a stale selector entry would refuse the next
        # registration of its (reused) fd number — a child's pidfd, or the next pubsub
        if self.pubsub_sock is not None:
            self.loop.remove_reader(self.pubsub_sock)
            self.pubsub_sock = None
        if self.pubsub is None:
            return
        try:
            self.pubsub.close()
        except (redis.RedisError, OSError):
            pass
        self.pubsub = None

    def _on_wake(self, _sock: Any, _mask: int) -> None:
        try:
            while True:
                message = self.pubsub.get_message(timeout=0.0)
                if message is None:
                    break
                if message.get("type") != "message":
                    continue
                self._on_wake_message(message["channel"], message["data"])
        except (redis.RedisError, OSError, AttributeError) as exc:
            self._redis_failed("subscribe", exc)
            self._unsubscribe()

    def _on_wake_message(self, channel: str, data: str) -> None:
        queue = channel[channel.index("{") + 1:channel.index("}")]
        due = int(float(data))
        if due == 0:
            self.want_claim = True
        else:
            self._claim_at(queue, due / 1000 - time.time())

    def _claim_at(self, queue: str, delay: float) -> None:
        """Claim again after `delay` seconds (a delayed job or the rate limit's next token)."""
        delay = max(0.001, min(delay, POLL_INTERVAL))
        due = time.monotonic() + delay
        current = self.claim_timers.get(queue)
        if current is not None and current[1] <= due:
            return
        if current is not None:
            self.loop.timers.cancel(current[0])
        handle = self.loop.timers.schedule(delay, lambda: self._claim_timer_fired(queue))
        self.claim_timers[queue] = (handle, due)

    def _claim_timer_fired(self, queue: str) -> None:
        self.claim_timers.pop(queue, None)
        self.want_claim = True

    def _poll(self) -> None:
        self.want_claim = True
        if self.pubsub is None and not self.draining:
            self._subscribe()

    # -- claiming and starting jobs ---------------------------------------------------------

    def _redis_ready(self) -> bool:
        return time.monotonic() >= self.redis_down_until

    def _redis_failed(self, op: str, exc: Exception) -> None:
        self.metrics.redis_error(op)
        now = time.monotonic()
        self.redis_down_until = now + self.redis_backoff
        if now - self.last_error_log > 5:
            log.warning("redis %s failed (%s); retrying with backoff", op, exc)
            self.last_error_log = now
        self.redis_backoff = min(self.redis_backoff * 2, REDIS_BACKOFF_MAX)

    def _redis_worked(self) -> None:
        if self.redis_backoff > 0.1:
            log.info("redis reachable again")
        self.redis_backoff = 0.1
        self.redis_down_until = 0.0  # it answered: flush, claim and reap now
        if self.pubsub is None and not self.draining:
            self._subscribe()  # the wake connection died with the outage: back at once

    def _queue_claims(self, pipe: Any) -> list[str]:
        """Queue a claim for each served queue with free slots; returns their names."""
        asks = []
        for qc in self.config.queues:
            free = qc.concurrency - self.running[qc.name]
            if free > 0:
                self.queues[qc.name].claim(self.id, free, self.leases.ttl_ms,
                                           self.policies[qc.name], client=pipe)
                asks.append(qc.name)
        return asks

    def _claimed(self, name: str, reply: Any, sent_at: float) -> None:
        if isinstance(reply, Exception):
            self._redis_failed("claim", reply)
            return
        result = self.queues[name].parse_claim(reply)
        for lease in result.leases:
            self._start(name, lease, sent_at)
        if result.next_due_ms >= 0:
            self._claim_at(name, (result.next_due_ms - result.now_ms) / 1000)
        if result.rate_wait_ms > 0:
            self._claim_at(name, result.rate_wait_ms / 1000)

    def _start(self, queue: str, lease: Any, sent_at: float) -> None:
        job = lease.job
        f = job.fields
        task = registry.lookup(job.task)
        if task is None:
            log.warning("job %s: unknown task %r: dead", job.id, job.task)
            outcome = Outcome("fail", "dead", mode="fatal",
                                 reason=f"unknown task {job.task!r}",
                                 error={"type": "UnknownTask", "reason": f"unknown task {job.task!r}",
                                        "message": f"no handler registered for {job.task!r}"})
            fake = RunningChild(lease, self._spec(queue, job, f), 0, -1, -1, time.monotonic(), 0)
            self.outbox.append(Pending(fake, outcome, lease.token))
            return
        spec = self._spec(queue, job, f)
        timeout = int(f.get("timeout_ms") or 300000) / 1000
        spec.cgroup = self._job_cgroup(job.id, spec.memory_limit)
        try:
            child = self._spawn(lease, spec, title=f"forq: job {job.id} {job.task}",
                                timeout=timeout)
        except BaseException:
            if spec.cgroup and self.cgroups is not None:
                self.cgroups.remove(spec.cgroup)
            raise
        self.children[job.id] = child
        self.running[queue] += 1
        self.leases.add(queue, job.id, lease.token, sent_at)
        if not child.forked_by_server:  # else the fork server's exit report is the event
            self.loop.add_reader(child.pidfd, lambda _f, _m, c=child: self._on_child_exit(c))
        self.loop.add_reader(child.pipe, lambda _f, _m, c=child: self._on_child_pipe(c))
        waited = None
        if f.get("started_at"):
            waited = max(0, int(f["started_at"]) - max(int(f.get("enqueued_at", 0)),
                                                       int(f.get("run_at", 0)))) / 1000
        self.metrics.job_started(queue, job.task, waited)
        self.metrics.set_children(queue, self.running[queue])
        log.info("job %s %s started in pid %d (attempt %d)", job.id, job.task, child.pid,
                 job.attempts + 1, extra={"job": job.id, "task": job.task, "event": "started"})
        self._set_title()

    def _job_cgroup(self, job_id: str, memory_limit: int) -> str:
        """A fresh cgroup for the job's child ("" when per-job cgroups are off)."""
        if self.cgroups is None or self.cgroups_failed:
            return ""
        try:
            return self.cgroups.create(job_id, memory_limit)
        except OSError as exc:
            log.error("job %s: cannot create its cgroup in %s (%s); memory limits by RSS "
                      "sampling from now on", job_id, self.cgroups.base, exc.strerror or exc)
            self.cgroups_failed = True
            return ""

    # -- the fork server -------------------------------------------------------------------

    def _start_fork_server(self) -> None:
        """Start the fork server ([supervisor].fork_server); if it cannot start, children
        are forked here, as without it."""
        if (not self.config.fork_server or self.fork_server is not None
                or self.fork_server_given_up):
            return
        try:
            server = ForkServer(self.config.imports)
        except ForkServerError as exc:
            log.error("fork server did not start (%s); forking job children from the "
                      "supervisor instead", exc)
            return
        self.fork_server = server
        self.loop.add_reader(server.sock, lambda _s, _m, f=server: self._on_fork_server(f))
        log.info("fork server started in pid %d", server.pid)

    def _spawn(self, lease: Any, spec: ChildSpec, *, title: str,
               timeout: float) -> RunningChild:
        server = self.fork_server
        if server is not None:
            try:
                child = server.spawn(lease, spec, title=title, timeout=timeout)
            except ForkServerError as exc:
                self._fork_server_lost(server, exc)
            else:
                if server.pending_exits:  # other children's exits read while waiting
                    self.loop.timers.schedule(0, lambda: self._dispatch_exits(server))
                return child
            if self.fork_server is not None:  # restarted: one more try
                try:
                    return self.fork_server.spawn(lease, spec, title=title, timeout=timeout)
                except ForkServerError as exc:
                    self._fork_server_lost(self.fork_server, exc)
        return spawn(lease, spec, title=title, timeout=timeout)

    def _on_fork_server(self, server: ForkServer) -> None:
        try:
            server.drain()
        except ForkServerError as exc:
            self._fork_server_lost(server, exc)
            return
        self._dispatch_exits(server)

    def _dispatch_exits(self, server: ForkServer) -> None:
        while server.pending_exits:
            pid, status, peak = server.pending_exits.pop(0)
            child = next((c for c in self.children.values()
                          if c.server == server.pid and c.pid == pid), None)
            if child is not None:
                self._child_ended(child, status, peak)
        if server in self.retiring and not self._children_of_server(server):
            self.retiring.remove(server)
            self.loop.remove_reader(server.sock)
            server.close()
            log.info("old fork server %d stopped", server.pid)

    def _children_of_server(self, server: ForkServer) -> list[RunningChild]:
        return [c for c in self.children.values() if c.server == server.pid]

    def _retire_fork_server(self) -> None:
        """Fork no more from the current fork server; stop it when its children end."""
        server, self.fork_server = self.fork_server, None
        if server is None:
            return
        if self._children_of_server(server):
            self.retiring.append(server)
        else:
            self.loop.remove_reader(server.sock)
            server.close()

    def _fork_server_lost(self, server: ForkServer, exc: Exception) -> None:
        """The fork server died (or stopped answering). Its children die with it
        (PR_SET_PDEATHSIG): each ends as a crash — or with its report, if it had written
        one — and a new fork server takes over, unless it keeps dying."""
        self.loop.remove_reader(server.sock)
        orphans = self._children_of_server(server)
        self._dispatch_exits(server)  # the exits it reported before it went
        orphans = [c for c in orphans if c.job_id in self.children]
        server.close()
        if self.fork_server is server:
            self.fork_server = None
        if server in self.retiring:
            self.retiring.remove(server)
        log.error("fork server %d lost (%s); %d running job(s) die with it", server.pid, exc,
                  len(orphans))
        deadline = time.monotonic() + KILL_GRACE
        for child in orphans:
            if not child.wait_exit(max(0.0, deadline - time.monotonic())):
                child.signal_group(signal.SIGKILL)
                child.wait_exit(1.0)
            if child.pipe_open:
                child.read_pipe()
            # its status died with the fork server: a complete report means it finished
            status = 0 if child.report() is not None else signal.SIGKILL
            self._child_ended(child, status, 0, cause=f"its fork server was lost ({exc})")
        now = time.monotonic()
        self.fork_server_losses = [t for t in self.fork_server_losses if now - t < 60] + [now]
        if len(self.fork_server_losses) > 5:
            log.error("fork server lost %d times in a minute: forking job children from the "
                      "supervisor from now on", len(self.fork_server_losses))
            self.fork_server_given_up = True
            return
        if not self.draining:
            self._start_fork_server()

    def _spec(self, queue: str, job: Any, f: dict[str, Any]) -> ChildSpec:
        qc = next((q for q in self.config.queues if q.name == queue), None)
        sandbox = self.config.sandbox
        return ChildSpec(
            job_id=job.id, queue=queue, task=job.task, args=job.args, kwargs=job.kwargs,
            attempts=job.attempts, crashes=job.crashes,
            memory_limit=int(f.get("memory_limit") or 0),
            max_result_bytes=int(f.get("max_result_bytes") or (1 << 20)),
            nice=qc.nice if qc else 10,
            address_space_factor=self.config.address_space_factor,
            run_as=sandbox.run_as,
            env_allow=list(sandbox.env_allow) if sandbox.env_allow is not None else None,
            max_open_files=sandbox.max_open_files,
        )

    # -- watching children ------------------------------------------------------------------

    def _on_child_pipe(self, child: RunningChild) -> None:
        if not child.read_pipe():
            self.loop.remove_reader(child.pipe)
            child.pipe_open = False
            if child.reader.done and child.kill_reason is None:
                # nothing it says from now on can be used: stop it now, not at its time limit
                log.warning("job %s %s: %s; killing its child", child.job_id, child.task,
                            child.reader.violation or "result too large")
                child.stop(PROTOCOL, grace=0)

    def _on_child_exit(self, child: RunningChild) -> None:
        """A child forked here exited (its pidfd is readable)."""
        # the job's whole process group goes with it: no grandchild outlives its job
        child.signal_group(signal.SIGKILL)
        _, status, usage = os.wait4(child.pid, 0)
        self.loop.remove_reader(child.pidfd)
        self._child_ended(child, status, usage.ru_maxrss * 1024)

    def _child_ended(self, child: RunningChild, status: int, peak_rss: int,
                     cause: str = "") -> None:
        """A child was reaped (here, or by the fork server, which killed its group first).
        `cause`: what is known beyond its status, said in the reason of a crash."""
        if child.pipe_open:
            child.read_pipe()
            self.loop.remove_reader(child.pipe)
        if child.spec.cgroup and self.cgroups is not None:
            # the cgroup's peak is what its limit applied to (a child's ru_maxrss also
            # counts the pages it shares with the fork server, charged to the server)
            child.oom = self.cgroups.oom_cause(child.spec.cgroup)
            child.peak_rss = (self.cgroups.usage(child.spec.cgroup, peak=True)
                              or max(child.peak_rss, peak_rss))
            self.cgroups.remove(child.spec.cgroup)
        else:
            child.peak_rss = max(child.peak_rss, peak_rss)
        os.close(child.pidfd)
        os.close(child.pipe)
        self.children.pop(child.job_id, None)
        self.running[child.queue] -= 1
        self.metrics.set_children(child.queue, self.running[child.queue])
        token = self.leases.token(child.job_id) or child.lease.token
        # the lease stays in the keeper (and is extended) until the report lands: a
        # result waiting out a Redis blip must not expire and be run again elsewhere
        outcome = classify(child, status)
        if outcome.kind == "fail" and outcome.error.get("type") == "MemoryError":
            outcome.metric = "memory"
        if outcome.kind == "expire" and cause:
            outcome.reason = f"{cause}: {outcome.reason}"
        # a release the child caused itself: it could not join its cgroup (JOIN_FAILED)
        if outcome.kind == "release" and child.kill_reason is None and not self.cgroups_failed:
            log.error("job %s: its child could not join its cgroup %s; job handed back, "
                      "memory limits by RSS sampling from now on", child.job_id,
                      child.spec.cgroup)
            self.cgroups_failed = True
        self.outbox.append(Pending(child, outcome, token))
        self.want_claim = True
        self._set_title()

    def _kill_after_grace(self, child: RunningChild) -> None:
        def kill() -> None:
            if self.children.get(child.job_id) is child:
                child.signal_group(signal.SIGKILL)

        self.loop.timers.schedule(KILL_GRACE, kill)

    def _police_children(self) -> None:
        """Every `memory_sample_interval`: each child's time limit, and the RSS of its
        process tree against its memory limit (in a per-job cgroup the kernel enforces it,
        and the tick only records the peak). One tick for all children, rather than a
        timer per child that would keep each finished child alive until its time limit."""
        if self.cgroups is not None:
            self.cgroups.sweep()
        now = time.monotonic()
        for child in list(self.children.values()):
            if child.forked_by_server and not child.alive():
                continue  # exited: its pid may be reaped, and reused, before its report
            if now >= child.deadline and child.kill_reason is None:
                timeout = child.deadline - child.started
                log.info("job %s %s: time limit %.3gs reached, stopping", child.job_id,
                         child.task, timeout)
                child.stop(TIMEOUT, f"{timeout:g}s", grace=KILL_GRACE)
                self._kill_after_grace(child)
            if child.spec.cgroup:  # the kernel enforces its limit: keep the peak only
                usage = JobCgroups.usage(child.spec.cgroup)
                child.peak_rss = max(child.peak_rss, usage)
                continue
            rss = memory.tree_rss(child.pid)
            child.peak_rss = max(child.peak_rss, rss)
            limit = child.spec.memory_limit
            if limit and rss > limit and child.kill_reason is None:
                log.info("job %s %s: memory %d MiB over its limit %d MiB, killing",
                         child.job_id, child.task, rss >> 20, limit >> 20)
                child.stop(MEMORY, f"{limit / (1 << 20):.0f} MiB", grace=0)

    # -- leases ----------------------------------------------------------------------------

    def _retry_extend(self) -> None:
        self.extend_retry = False
        self._extend_leases()

    def _extend_leases(self) -> None:
        if not len(self.leases):
            return
        try:
            lost, cancelled = self.leases.extend(self.redis, self.queues)
        except (redis.RedisError, OSError) as exc:
            self._redis_failed("extend", exc)
            # try again soon rather than a whole ttl/3 later: a short Redis blip must not
            # cost a running job its lease
            if not self.extend_retry:
                self.extend_retry = True
                self.loop.timers.schedule(max(0.05, min(0.25, self.config.lease_ttl / 10)),
                                          self._retry_extend)
            return
        self._redis_worked()
        self.metrics.lease_extended(len(self.leases))
        for job_id in lost:
            child = self.children.get(job_id)
            if child is not None:
                log.warning("job %s %s: lease lost, killing its child (fencing)", job_id, child.task)
                child.stop(LEASE_LOST, grace=0)
        for job_id in cancelled:
            child = self.children.get(job_id)
            if child is not None:
                log.info("job %s %s: cancelled, stopping its child", job_id, child.task)
                child.stop(CANCELLED, grace=0)

    def _fence_unproven(self) -> None:
        """Kill any child whose lease this supervisor can no longer prove it holds,
        before another supervisor's reaper can hand the job to someone else."""
        for job_id in self.leases.unproven():
            child = self.children.get(job_id)
            if child is not None and child.kill_reason != LEASE_LOST:
                log.warning("job %s %s: lease not confirmed in time, killing its child",
                            job_id, child.task)
                child.stop(LEASE_LOST, grace=0)
            self.leases.remove(job_id)

    def _reap(self) -> None:
        if not self._redis_ready():
            return
        names = self._served()
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            default_max = int(json.loads(self.policies[name])["defaults"].get("max_crashes", 3))
            self.queues[name].reclaim(self.id, default_max, client=pipe)
        try:
            replies = pipe.execute()
        except (redis.RedisError, OSError) as exc:
            self._redis_failed("reclaim", exc)
            return
        for name, reply in zip(names, replies, strict=True):
            to_pending, to_dead, completed, ids = Queue.parse_reclaim(reply)
            if ids:
                self.metrics.reclaimed(name, len(ids))
                log.info("reclaimed %d expired lease(s) in %s: %d to pending, %d dead, "
                         "%d already complete", len(ids), name, to_pending, to_dead, completed)
                self.want_claim = True

    # -- reporting ---------------------------------------------------------------------------

    def _sync(self) -> None:
        """One round trip for everything waiting: claims for the free slots and the
        finished children's reports (a finished job's slot is refilled in the same trip).

        On a Redis error the reports stay queued and are sent again: each is fenced by
        its token, so a report that did land the first time is answered "lost" the
        second, and changes nothing."""
        if not self._redis_ready():
            return
        claiming = self.want_claim and not self.draining
        self.want_claim = False
        batch, self.outbox = self.outbox, []
        pipe = self.redis.pipeline(transaction=False)
        # claims first: a global max_in_flight still counts our finished jobs, so the
        # ack's wake-up lets every supervisor race fairly for the freed slot
        asks = self._queue_claims(pipe) if claiming else []
        spans = []
        reap = set()
        for item in batch:
            start = len(pipe.command_stack)
            self._queue_report(pipe, item)
            if item.outcome.kind == "expire":
                reap.add(item.child.queue)
            spans.append((start, len(pipe.command_stack)))
        reap_names = sorted(reap)
        for name in reap_names:
            default_max = int(json.loads(self.policies.get(name, "{}") or "{}")
                              .get("defaults", {}).get("max_crashes", 3))
            self.queues[name].reclaim(self.id, default_max, client=pipe)
        waits = self._queue_waits(pipe, batch) if batch else 0
        if not len(pipe.command_stack):
            return
        sent_at = time.monotonic()
        try:
            replies = pipe.execute(raise_on_error=False)
        except (redis.RedisError, OSError) as exc:
            self.outbox = batch + self.outbox
            self.want_claim = self.want_claim or claiming
            self._redis_failed("report" if batch else "claim", exc)
            return
        self._redis_worked()
        if waits:
            replies = self._check_waits(batch, replies, waits)
        for item, (start, end) in zip(batch, spans, strict=True):
            self._reported(item, replies[start:end])
        for offset, name in enumerate(asks):
            self._claimed(name, replies[offset], sent_at)
        for name, reply in zip(reap_names, replies[len(replies) - len(reap_names):], strict=True):
            if isinstance(reply, list) and reply[3:]:
                self.metrics.reclaimed(name, len(reply) - 3)
                self.want_claim = True

    def _queue_waits(self, pipe: Any, batch: list[Pending]) -> int:
        """[redis].min_replicas: WAIT after the reports, on the connection(s) that sent
        them (one per shard in a cluster). Returns how many WAIT replies come last."""
        if not self.config.redis_min_replicas:
            return 0
        names = {item.child.queue for item in batch}
        for item in batch:
            names.update(f.get("queue", item.child.queue) for f in item.outcome.followups)
        return topology.queue_wait(pipe, self.config.redis_min_replicas, self.wait_ms,
                                   [QueueKeys(name).active for name in sorted(names)])

    def _check_waits(self, batch: list[Pending], replies: list[Any], waits: int) -> list[Any]:
        """Log the reports that did not reach min_replicas in time; strip the WAITs."""
        needed = self.config.redis_min_replicas
        short = topology.short_of(replies[-waits:], needed)
        if short is not None:
            self.metrics.redis_error("replicate")
            log.warning("reports of job(s) %s not replicated: %d of %d replica(s) acknowledged "
                        "within %d ms; a failover now could undo them",
                        ", ".join(item.child.job_id for item in batch), short, needed,
                        self.wait_ms)
        return replies[:-waits]

    def _queue_report(self, pipe: Any, item: Pending) -> None:
        child, outcome, token = item.child, item.outcome, item.token
        q = self.queues[child.queue]
        job_id = child.job_id
        if outcome.kind == "ack":
            fields = child.lease.job.fields
            task = registry.lookup(child.task)
            same = [f for f in outcome.followups if f.get("queue", child.queue) == child.queue]
            # other queues' follow-ups first (deterministic ids, so a re-run adds none):
            # Redis runs the pipeline in order, so once a completion record exists they do
            for other in sorted({f["queue"] for f in outcome.followups} - {child.queue}):
                specs = [f for f in outcome.followups if f.get("queue") == other]
                self._queue_for(other).send_specs(specs, pipe)
            if fields.get("idempotent") in ("1", 1) or (task is not None and task.idempotent):
                ttl = int(fields.get("idempotency_ttl_ms") or IDEMPOTENCY_TTL_MS)
                # with the same-queue follow-ups: if this ack is lost, the reclaim that
                # finds the completion enqueues them instead
                q.record_done(job_id, outcome.result_json, ttl, same, client=pipe)
            q.ack(job_id, token, outcome.result_json, same, client=pipe)
        elif outcome.kind == "fail":
            q.fail(job_id, token, outcome.error, outcome.mode, client=pipe)
        elif outcome.kind == "expire":
            q.expire(job_id, token, outcome.reason, client=pipe)
        elif outcome.kind == "release":
            q.release(job_id, token, outcome.reason, client=pipe)

    def _queue_for(self, name: str) -> Queue:
        if name not in self.queues:
            self.queues[name] = Queue(name, redis=self.redis)
        return self.queues[name]

    def _reported(self, item: Pending, replies: list[Any]) -> None:
        child, outcome = item.child, item.outcome
        if self.leases.token(child.job_id) == item.token:
            self.leases.remove(child.job_id)  # not a newer lease of the same job
        metric = outcome.metric
        last = replies[-1] if replies else None
        if isinstance(last, Exception):
            log.error("job %s %s: report failed: %s", child.job_id, child.task, last)
            metric = None
        elif outcome.kind == "fail":
            result = Queue.parse_fail(last)
            if result.outcome == "lost":
                metric = "lease_lost"
            elif result.outcome == "dead":
                metric = "dead" if outcome.metric in ("failed", "dead") else outcome.metric
            elif result.outcome == "retry" and outcome.metric == "failed":
                metric = "retried"
            log.info("job %s %s: %s → %s (attempt %d)", child.job_id, child.task,
                     outcome.reason or outcome.error.get("reason"), result.outcome,
                     result.attempts, extra={"job": child.job_id, "event": result.outcome})
        elif last == "lost":
            metric = "lease_lost"
            log.warning("job %s %s: %s answered lost (lease no longer ours); dropped",
                        child.job_id, child.task, outcome.kind)
        elif outcome.kind == "drop":
            log.warning("job %s %s: lease lost; result dropped", child.job_id, child.task)
        else:
            verb = {"ack": "succeeded", "expire": "crashed", "release": "released"}[outcome.kind]
            log.info("job %s %s %s%s in %.3fs", child.job_id, child.task, verb,
                     f" ({outcome.reason})" if outcome.reason else "",
                     time.monotonic() - child.started,
                     extra={"job": child.job_id, "event": verb})
        if metric and child.pid:
            self.metrics.job_finished(child.queue, child.task, metric,
                                      time.monotonic() - child.started, child.peak_rss or None)
        elif metric:
            self.metrics.job_finished(child.queue, child.task, metric, 0.0, None)

    # -- status ----------------------------------------------------------------------------

    def _slots(self) -> int:
        return sum(q.concurrency for q in self.config.queues)

    def _status(self) -> str:
        state = "draining" if self.draining else "running"
        return f"{state}: {len(self.children)}/{self._slots()} busy"

    def _set_title(self) -> None:
        try:
            import setproctitle

            setproctitle.setproctitle(
                f"forq: supervisor {self.name} [{len(self.children)}/{self._slots()}]")
        except Exception:  # noqa: BLE001 — a title is cosmetic
            pass

    def _heartbeat(self) -> None:
        self.notifier.status(self._status())
        self._set_title()
        if self.metrics_server is not None:
            self.metrics_server.sweep()
        if not self._redis_ready():
            return
        try:
            self.registry.beat({
                "name": self.name, "host": socket.gethostname(), "pid": os.getpid(),
                "queues": self._served(), "busy": len(self.children), "slots": self._slots(),
                "draining": self.draining,
            })
        except (redis.RedisError, OSError) as exc:
            self._redis_failed("heartbeat", exc)

    def _read_depths(self) -> dict[str, dict[str, int]]:
        names = self._served()
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            k = QueueKeys(name)
            for key in (k.pending, k.scheduled, k.active, k.dead):
                pipe.zcard(key)
        replies = pipe.execute()
        out = {}
        for i, name in enumerate(names):
            p, s, a, d = replies[4 * i:4 * i + 4]
            out[name] = {"pending": p, "scheduled": s, "active": a, "dead": d}
        return out


def run_supervisor(config_path: str, log_format: str | None = None) -> int:
    """`forq run`: load the config (a bad one is one line and exit 2), then run."""
    from forq.supervisor import logs

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"forq: {exc}", file=__import__("sys").stderr)
        return 2
    logs.setup(log_format or config.log_format)
    return Supervisor(config).run()
