"""The supervisor: lease jobs, fork one child per job, keep the leases alive from the
parent, enforce limits, report every end, drain on SIGTERM.

Read it top to bottom as the life of a job: `_sync` has the `Claimer` lease jobs for
free slots (in the same round trip as the finished children's reports),
`Children.start` has the `Spawner` fork its child, `LeaseRenewal` keeps its lease (the
`Fencer` kills the child if the lease is lost), `LimitPolice` enforces its time and
memory limits, `Children.ended` classifies its end (`outcomes.classify`) and the
`Reporter` tells Redis. `Drain` is what SIGTERM does; `Reload` what SIGHUP does (the
config and the handler code).

The collaborators, each in its own module: `EventLoop` (one selector, timers, signals),
`RedisHealth` (backoff after a Redis error), `Wakeups` (when to claim: pub/sub, timers,
a poll), `Spawner` (the fork server and the children's ends), `Launcher` (each child's
spec and cgroup), `LeaseKeeper` + `LeaseRenewal` + `Fencer`, `LimitPolice`, `Reaper`,
`Reporter`, `Scheduler` (cron), `Metrics`, `Heartbeat` + `Roster` (live supervisors),
`Notifier` (sd_notify).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket

import redis

from forq import Queue
from forq.defaults import MAX_CRASHES
from forq.store.connection import connect, describe
from forq.store.topology import fail_fast, is_cluster
from forq.supervisor.children.launch import Launcher
from forq.supervisor.children.spawner import Spawner
from forq.supervisor.children.table import Children, police_every
from forq.supervisor.config.load import Config, ConfigError, check_redis_url, load_config
from forq.supervisor.fork.client import ForkServerFatal
from forq.supervisor.isolation import cgroups, protections
from forq.supervisor.leases.fencing import Fencer
from forq.supervisor.leases.held import HeldLeases
from forq.supervisor.leases.keeper import LeaseKeeper
from forq.supervisor.leases.renewal import LeaseRenewal
from forq.supervisor.loop import status
from forq.supervisor.loop.drain import Drain
from forq.supervisor.loop.eventloop import EventLoop
from forq.supervisor.loop.heartbeat import INTERVAL as HEARTBEAT_INTERVAL
from forq.supervisor.loop.heartbeat import Heartbeat
from forq.supervisor.loop.reload import Reload, renamed_hint
from forq.supervisor.loop.sdnotify import Notifier, watchdog_interval
from forq.supervisor.loop.wakeups import POLL_INTERVAL, Wakeups
from forq.supervisor.observe import tracing
from forq.supervisor.observe.metrics import Metrics
from forq.supervisor.observe.metrics_memory import MemoryCollector
from forq.supervisor.observe.metrics_server import MetricsServer
from forq.supervisor.observe.retention import RetentionCollector
from forq.supervisor.redis_io import checks as redis_checks
from forq.supervisor.redis_io.claimer import Claimer
from forq.supervisor.redis_io.health import RedisHealth, wait_until_reachable
from forq.supervisor.redis_io.notes import JobNotes
from forq.supervisor.redis_io.queue_settings import ShardSettings, push_queue_settings
from forq.supervisor.redis_io.reaper import Reaper
from forq.supervisor.redis_io.relay import BatchRelay
from forq.supervisor.redis_io.reports import Pending, Reporter
from forq.supervisor.redis_io.roster import Roster
from forq.supervisor.redis_io.roundtrip import RoundTrip
from forq.supervisor.redis_io.scheduler import Scheduler
from forq.supervisor.redis_io.shard_health import ShardHealth
from forq.supervisor.redis_io.shards import ping_home

log = logging.getLogger("forq.supervisor")



class Supervisor:
    def __init__(self, config: Config, *, loop: EventLoop | None = None,
                 client: redis.Redis | None = None) -> None:
        self.config = config
        self.id = f"{socket.gethostname()}:{os.getpid()}"
        self.name = config.name
        self.loop = loop or EventLoop()
        # short socket timeouts: a blocked call blocks lease keeping for every child
        timeout = max(0.2, min(2.0, config.lease_ttl / 4))
        self.redis = client or connect(
            config.redis_url, password=config.redis_password, socket_timeout=timeout,
            socket_connect_timeout=timeout, health_check_interval=0, retry_on_timeout=False,
            **fail_fast(config.redis_url))
        self.queues: dict[str, Queue] = {}
        self.outbox: list[Pending] = []
        self.want_claim = True
        self.metrics = Metrics(lambda: status.read_depths(self.redis, self.served(),
                                                          self.metrics.set_tripped),
                               name=self.name)
        self.metrics.registry.register(RetentionCollector(
            lambda: self.redis, self.served, lambda: self.metrics.redis_error("scrape")))
        self.metrics_server: MetricsServer | None = None
        self.heartbeat = Heartbeat(self)
        self.notifier = Notifier.from_env()
        self.roster = Roster(self.redis, self.id)
        self.health = RedisHealth(self.metrics.redis_error)
        self.sharded = is_cluster(self.redis)
        # a cluster's shards back off one by one; on a plain Redis this is `health`
        self.shards = ShardHealth(self.redis, self.health, self.metrics.redis_error,
                                  on_down=self._shard_down,
                                  on_up=lambda shard: self.metrics.shard_state(shard, False))
        self.wakeups = Wakeups(self.loop, self.redis, self.health, self._wake,
                               # listen for wake-ups on a shard that answers
                               pick_node=self.shards.healthy_node if self.sharded else None)
        self.leases = LeaseKeeper(config.lease_ttl)
        self.launcher = Launcher(config)
        # children's progress, steps and requests for their parents' results
        self.notes = JobNotes(self._queue_for, self.metrics, self.loop)
        # The parts below call each other both ways (a child's end goes from the spawner
        # to the children, a child's start asks the fencer for its first deadline, a fork
        # server that starts slowly needs the renewal): those calls go through `self`.
        self.spawner = Spawner(
            self.loop, lambda: self.children.unique(),
            lambda *end: self.children.ended(*end),
            # a new fork server (start, reload) may import for longer than a lease lasts
            while_waiting=(config.lease_ttl / 3, lambda: self.renewal.extend()),
            running=lambda: bool(self.children.by_job))
        self.children = Children(
            self.loop, self.launcher, self.spawner, self.leases,
            HeldLeases(self.leases, on_change=self.metrics.set_held), self.metrics,
            on_report=self._report, on_notes=self.notes.heard,
            first_deadline=lambda sent_at: self.fencer.first_deadline(sent_at),
            on_change=lambda: self.heartbeat.set_title())
        self.metrics.registry.register(MemoryCollector(self.children.memory))
        self.fencer = self.make_fencer()
        self.renewal = LeaseRenewal(
            self.leases, self.redis, self.queues, self.fencer, self.spawner, self.health,
            self.metrics, self.loop.timers, self._redis_worked,
            riders=lambda pipe: self.notes.send_progress(pipe, self.children,
                                                         self.leases.token).answered,
            shards=self.shards if self.sharded else None, held=self.children)
        self.drain = Drain(self.loop, self.children, self.spawner, self.wakeups, self.notifier)
        self.reloads = Reload(self)
        # [redis].min_replicas: a WAIT must end before the socket times out
        wait_ms = int(min(config.redis_wait_timeout, timeout * 0.8) * 1000)
        self.reporter = self.make_reporter(config.redis_min_replicas, wait_ms)
        self.claimer = Claimer(self.id, self._queue_for, self.children, self.leases,
                               self.wakeups, self.health, self.shards, code=self.code)
        self.settings = ShardSettings(self.redis, self._queue_for, self.shards,
                                      self.claimer.unsettled)
        self.reaper = Reaper(self.id, self._queue_for, self.metrics, self._wake)
        self.relay = BatchRelay(self._queue_for)
        self.scheduler = Scheduler(config.schedules, self.redis, self._queue_for)
        self.trip = RoundTrip(
            self.redis, claimer=self.claimer, notes=self.notes, reporter=self.reporter,
            reaper=self.reaper, settings=self.settings, leases=self.leases,
            health=self.health, shards=self.shards, sharded=self.sharded,
            on_answer=self._redis_worked)
        self.apply_config(config)

    # seams: a deliberately broken build (chaos/broken.py) overrides these two
    def make_fencer(self) -> Fencer:
        return Fencer(self.leases, self.children.by_job)

    def make_reporter(self, min_replicas: int, wait_ms: int) -> Reporter:
        return Reporter(self._queue_for, self.leases, self.metrics, min_replicas, wait_ms,
                        task_info=self.spawner.task_info)  # the fork server's task table

    # -- configuration -------------------------------------------------------------

    def apply_config(self, config: Config) -> None:
        self.config = config
        self.launcher.config = config
        self.reporter.meter = config.job_cost
        for qc in config.queues:
            self._queue_for(qc.name)
            policy = config.job_policy(qc.name)
            self.claimer.policies[qc.name] = json.dumps(policy)
            self.reaper.max_crashes[qc.name] = int(policy["defaults"].get("max_crashes",
                                                                           MAX_CRASHES))
            self.metrics.declare_queue(qc.name, qc.concurrency)
        self.children.configure(config.queues, config.memory_budget,
                                config.memory_reserve_after)

    def served(self) -> list[str]:
        return [qc.name for qc in self.config.queues]

    def _queue_for(self, name: str) -> Queue:
        if name not in self.queues:
            self.queues[name] = Queue(name, redis=self.redis)
        return self.queues[name]

    def push_limits(self) -> None:
        if self.sharded:
            self.settings.push_each(self.config.queues)
            return
        try:
            push_queue_settings(self.config.queues, self._queue_for, self.redis)
        except (redis.RedisError, OSError) as exc:
            self.health.failed("limits", exc)

    def code(self) -> str:
        """The handler code the jobs started now run: `[supervisor].version` and the
        fingerprint its fork server reported (`fork/fingerprint.py`)."""
        return self.spawner.code

    # -- start and stop ---------------------------------------------------------------

    def _start_forking(self) -> bool:
        try:
            self.spawner.configure(self.config.fork_server, Launcher.fork_server_launch(self.config))
        except ForkServerFatal as exc:
            log.error("the fork server did not start ([supervisor].imports and [sandbox] of "
                      "%s): %s%s", self.config.path, exc, renamed_hint(exc.module))
            return False
        return True

    def run(self) -> int:
        self.spawner.strays.adopt()  # what a lost fork server's jobs leave comes to us
        try:  # before the fork server starts: it must live in the supervisor's own cgroup
            self.launcher.cgroups, memory_mode = cgroups.probe(self.config.job_cgroups)
        except cgroups.CgroupsUnavailable as exc:
            log.error("per-job cgroups unavailable: %s ([supervisor].job_cgroups = "
                      "\"required\" in %s)", exc, self.config.path)
            self.loop.close()
            return 1
        if not self._start_forking() or not protections.announce(
                self.config, self.spawner.namespaces_problem, self.launcher,
                self.spawner.hidden):
            self.loop.close()
            return 2
        try:
            tracing.configure(self.config.tracing)
        except tracing.TracingUnavailable as exc:
            log.error("%s (%s)", exc, self.config.path)
            self.loop.close()
            return 1
        log.info("supervisor %s (%s) starting: queues %s; memory limits by %s",
                 self.name, self.id,
                 ", ".join(f"{q.name}×{q.concurrency}" for q in self.config.queues),
                 memory_mode)
        log.info("redis at %s (from %s)", describe(self.config.redis_url),
                 self.config.redis_url_source or "the caller")
        self.loop.watch_signals((signal.SIGTERM, signal.SIGINT, signal.SIGHUP), self._on_signal)
        # able to serve before Redis answers: metrics bound, the watchdog fed, READY=1
        # (a Redis that is down is not a start failure; systemd would kill and restart us)
        try:
            self.metrics_server = MetricsServer.serving(self.metrics, self.config.metrics_listen,
                                                        self.loop.selector)
        except OSError as exc:
            log.error("cannot serve metrics on %s:%s: %s ([metrics].listen in %s)",
                      *(self.config.metrics_listen or ("", "")), exc.strerror or exc,
                      self.config.path)
            self.loop.close()
            return 1
        interval = watchdog_interval()
        if interval:
            self.loop.timers.every(interval, self.notifier.watchdog)
        waiting = f"waiting for Redis at {describe(self.config.redis_url)}"
        wait_until_reachable(self.redis, self.loop, stopped=lambda: self.drain.active,
                             on_first_miss=lambda: self.notifier.ready(waiting),
                             ping=lambda: ping_home(self.redis))
        if self.drain.active:
            self._shutdown()
            return 0
        if not redis_checks.check_at_start(self.redis, self.config.redis_allow_eviction,
                                           self.config.path, describe(self.config.redis_url)):
            self._shutdown()
            return 2
        self.push_limits()
        self.wakeups.subscribe(self.served())
        self.loop.timers.every(self.config.lease_ttl / 3, self.renewal.extend)
        self.loop.timers.every(self.config.reaper_interval, lambda: self.reaper.reap(
            self.redis, self.served(), self.health, self.relay,
            self.shards if self.sharded else None))
        police_every(self.children, self.config.memory_sample_interval)
        self.loop.timers.every(HEARTBEAT_INTERVAL, self.heartbeat.beat)
        self.loop.timers.every(POLL_INTERVAL, self.wakeups.poll)
        self.scheduler.run_on(self.loop.timers, self.health, lambda: self.drain.active)
        self.heartbeat.beat()
        self.notifier.ready(self.heartbeat.status())
        log.info("ready")
        while not self.drain.finished(len(self.outbox), self.config.drain_timeout):
            self.fencer.unproven()
            if self.want_claim or self.outbox or self.notes.waiting:
                self._sync()
            # a full claim batch asks for more: run what is due, but do not wait
            self.loop.run_once(cap=0.0 if self.want_claim and self.health.ready() else 1.0)
        self._shutdown()
        return 0

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGHUP:
            self.reloads.signal()
            return
        self.drain.signal(signum, self.config.drain_timeout, self.heartbeat.status())

    def _shutdown(self) -> None:
        try:
            self.roster.leave()
        except (redis.RedisError, OSError):
            pass
        self.wakeups.stop()
        if self.metrics_server is not None:
            self.metrics_server.close()
        self.spawner.close()
        if self.launcher.cgroups is not None:
            self.launcher.cgroups.sweep()
        self.loop.close()
        log.info("stopped")

    def _shard_down(self, shard: str) -> None:
        self.metrics.shard_state(shard, True)
        self.wakeups.shard_down(shard)

    def _wake(self) -> None:
        self.want_claim = True

    def _report(self, item: Pending) -> None:
        """A child ended: report it (and refill its slot) on the next loop turn."""
        self.outbox.append(item)
        self.want_claim = True

    def _redis_worked(self) -> None:
        if not self.sharded:  # a shard's answer says nothing of the others
            self.health.worked()  # it answered: report, claim and reap now
        if not self.drain.active:
            self.wakeups.resubscribe()  # the wake connection died with the outage

    # -- claiming and starting jobs ------------------------------------------------------

    def _sync(self) -> None:
        """One round trip for everything waiting (`RoundTrip`): claims for the free
        slots and the finished children's reports, so a finished job's slot is refilled
        in the same trip."""
        if not self.trip.ready():
            return
        claiming = self.want_claim and not self.drain.active
        self.want_claim = False
        # reports of children that end while the answers are read queue up behind these
        outbox, self.outbox = self.outbox, []
        result = self.trip.run(outbox, claiming, self.config)
        self.outbox = result.outbox + self.outbox
        self.want_claim = self.want_claim or result.claim_again


def run_supervisor(config_path: str, log_format: str | None = None,
                   redis_url: str | None = None) -> int:
    """`forq run`: load the config (a bad one is one line and exit 2), then run.
    `redis_url` (`forq run --redis URL`) wins over FORQ_REDIS_URL and the file."""
    import sys

    from forq.supervisor.loop import logs

    try:
        config = load_config(config_path)
        if redis_url:
            check_redis_url(redis_url, "--redis")
            config = dataclasses.replace(config, redis_url=redis_url, redis_url_source="--redis")
    except ConfigError as exc:
        print(f"forq: {exc}", file=sys.stderr)
        return 2
    logs.setup(log_format or config.log_format)
    return Supervisor(config).run()
