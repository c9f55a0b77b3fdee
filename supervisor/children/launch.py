"""Launcher: what a leased job's child needs, decided before the fork.

Everything a child needs is computed here, in the supervisor, and handed over as one
`ChildSpec`: the child runs untrusted code and must not have to look anything up. The
job's cgroup (per-job cgroup v2 memory limits) is created here too, before the fork,
so the child can join it before any handler code runs.
"""

from __future__ import annotations

import logging
import os

from forq.defaults import MAX_RESULT_BYTES, TIMEOUT_MS
from forq.queue import Lease
from forq.supervisor.config.load import Config
from forq.supervisor.config.queues import DEFAULT_MAX_THROTTLE
from forq.supervisor.fork.child import ChildSpec
from forq.supervisor.fork.environment import Launch, fork_server_env
from forq.supervisor.isolation.cgroups import JobCgroups

log = logging.getLogger("forq.supervisor")


class Launcher:
    def __init__(self, config: Config, cgroups: JobCgroups | None = None) -> None:
        self.config = config
        self.cgroups = cgroups
        self.cgroups_failed = False  # a cgroup could not be made or joined: no more of them
        self.namespaces_ok = False  # the fork server's probe: jobs can have namespaces

    def spec(self, queue: str, lease: Lease) -> ChildSpec:
        job, f = lease.job, lease.job.fields
        qc = next((q for q in self.config.queues if q.name == queue), None)
        sandbox = self.config.sandbox
        network = sandbox.task_network.get(job.task) or (
            qc.network if qc and qc.network else sandbox.network)
        return ChildSpec(
            job_id=job.id, queue=queue, task=job.task, args=job.args, kwargs=job.kwargs,
            attempts=job.attempts, crashes=job.crashes,
            memory_limit=int(f.get("memory_limit") or 0),
            max_result_bytes=int(f.get("max_result_bytes") or MAX_RESULT_BYTES),
            nice=qc.nice if qc else 10,
            address_space_factor=self.config.address_space_factor,
            run_as=sandbox.run_as,
            env_allow=list(sandbox.env_allow) if sandbox.env_allow is not None else None,
            max_open_files=sandbox.max_open_files,
            max_output_bytes=sandbox.max_output_bytes,
            # no network or a private /tmp needs namespaces of its own
            namespaces=self.namespaces_ok and (sandbox.namespaces or network == "none"
                                               or sandbox.private_tmp),
            network=network,
            private_tmp=sandbox.private_tmp,
            tmp_bytes=sandbox.tmp_size,
            max_processes=sandbox.max_processes,
            steps=job.recorded_steps(),  # a re-run returns these without running them
            group=f.get("group") or None,
            snoozes=job.snoozes,
            max_throttle_ms=int((qc.max_throttle if qc else DEFAULT_MAX_THROTTLE) * 1000),
        )

    @staticmethod
    def fork_server_launch(config: Config) -> Launch:
        """What the fork server imports, as whom, and its scrubbed environment: the
        supervisor never imports handler modules itself."""
        env = fork_server_env(os.environ, config.sandbox.env_allow,
                              [config.redis_password, config.redis_url])
        return Launch(tuple(config.imports), config.sandbox.run_as, tuple(sorted(env.items())),
                      probe=Launcher(config).wants_namespaces(),
                      hide=Launcher.secret_files(config),
                      spares=Launcher.spares(config), version=config.version,
                      huge_pages=config.huge_pages)

    @staticmethod
    def secret_files(config: Config) -> tuple[str, ...]:
        """The files a `run_as` job must not read, whatever their mode: the config and
        the Redis password file (a job as the supervisor's own user reads them anyway)."""
        if not config.sandbox.run_as:
            return ()
        return tuple(os.path.realpath(p) for p in (config.path, config.redis_password_file)
                     if p)

    @staticmethod
    def spares(config: Config) -> int:
        """How many idle children the fork server keeps forked in advance: as many as
        jobs may start at once here, at most 2 — and none without a fork server.

        Latency: a spare is forked before its job arrives, so the supervisor's wait for
        the fork server's reply (and the job's wait for its handler to start) no longer
        includes a fork, the largest cost between a claim and the handler's first line.
        Memory: a spare is a copy-on-write copy of the fork server, cheap while idle
        (its page tables, a few MiB), and paid for each spare: 2 covers the burst of one
        claim turn on a small machine, and more would only hold memory while idle."""
        if not config.fork_server:
            return 0
        return min(sum(q.concurrency for q in config.queues), 2)

    @staticmethod
    def timeout(lease: Lease) -> float:
        """The job's time limit, in seconds."""
        return int(lease.job.fields.get("timeout_ms") or TIMEOUT_MS) / 1000

    def wants_namespaces(self) -> tuple[bool, bool] | None:
        """What the fork server should try at start (network none, private /tmp), or
        None if no job of this config gets namespaces."""
        sb = self.config.sandbox
        network = (sb.network == "none" or any(q.network == "none" for q in self.config.queues)
                   or "none" in sb.task_network.values())
        if sb.namespaces or network or sb.private_tmp:
            return network, sb.private_tmp
        return None

    def cgroup(self, job_id: str, memory_limit: int) -> str:
        """A fresh cgroup for the job's child ("" when per-job cgroups are off)."""
        if self.cgroups is None or self.cgroups_failed:
            return ""
        try:
            return self.cgroups.create(job_id, memory_limit, self.config.sandbox.max_processes)
        except OSError as exc:
            log.error("job %s: cannot create its cgroup in %s (%s); memory limits by RSS "
                      "sampling from now on", job_id, self.cgroups.base, exc.strerror or exc)
            self.cgroups_failed = True
            return ""

    def discard(self, spec: ChildSpec) -> None:
        """The child was never forked: its cgroup goes."""
        if spec.cgroup and self.cgroups is not None:
            self.cgroups.remove(spec.cgroup)

    def child_could_not_join(self, job_id: str, cgroup: str) -> None:
        """The child exited JOIN_FAILED: fall back on RSS sampling, once, saying why."""
        if not self.cgroups_failed:
            log.error("job %s: its child could not join its cgroup %s; job handed back, "
                      "memory limits by RSS sampling from now on", job_id, cgroup)
            self.cgroups_failed = True
