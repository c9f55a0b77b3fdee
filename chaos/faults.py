"""The fault injector: seeded, one fault at a time, each kind at least `min_each` times.

Faults are serialized on purpose: each one's effect (and the latency the checker
measures for it) is then attributable to it alone. A fault "occupies" the system for
its own recovery window (e.g. lease_ttl + reaper_interval + tolerance after a
supervisor kill) before the next one starts.

Every fault is recorded with wall-clock times (the same clock as Redis TIME on this
machine) and its target, for the checker to attribute re-executions and to measure
reclaim latency.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from typing import Any

import redis

from forq import Queue

from .context import QUEUE, Context
from .procs import SupervisorProc, job_children_of
from .producer import client, enqueue_recorded, memhog_job
from .proxy import BLACKHOLE, CUT, PASS, SLOW

KINDS = ("child_kill", "sup_kill", "sup_stop", "sup_term", "redis_kill", "redis_stop", "memhog",
         "redis_full", "partition")

LONG_TASKS = ("chaos.slow", "chaos.idem", "chaos.cpu")


class Injector(threading.Thread):
    def __init__(self, ctx: Context) -> None:
        super().__init__(name="injector", daemon=True)
        self.ctx = ctx
        s = ctx.settings
        self.rng = random.Random(f"{s.seed}-faults")
        self.kinds = tuple(s.faults) or KINDS
        self.queue: Queue | None = None
        self.memhogs = 0
        self.child_kills = 0
        self.tries: dict[str, int] = {}

    # -- planning -----------------------------------------------------------------------

    def estimate(self, kind: str) -> float:
        """How long a fault occupies the system, recovery window included."""
        s = self.ctx.settings
        return {
            "child_kill": s.child_bound + 0.3,
            "memhog": 0.5,
            "sup_kill": s.reclaim_bound + 0.3,
            "sup_stop": s.lease_ttl + 1.0 + 1.5,
            "sup_term": s.drain_timeout + 1.5,
            "redis_kill": 2.0,
            "redis_stop": 3.5,
            "redis_full": 4.5,
            "partition": s.lease_ttl + 1.5 + 1.5,
        }[kind]

    def run(self) -> None:
        ctx, s = self.ctx, self.ctx.settings
        try:
            self.queue = Queue(QUEUE, redis=client(ctx.redis.url))
            t0 = time.monotonic()
            warmup = min(3.0, s.duration * 0.05)
            window_end = t0 + max(warmup, s.duration - min(5.0, s.duration * 0.08))
            mandatory = [k for k in self.kinds for _ in range(s.min_each)]
            self.rng.shuffle(mandatory)
            self._sleep(warmup)
            while not ctx.stop.is_set():
                now = time.monotonic()
                left = window_end - now
                if mandatory:
                    kind = mandatory.pop(0)
                else:
                    kind = self.rng.choice(self.kinds)
                    if self.estimate(kind) > left:
                        break
                self.inject(kind)
                need = sum(self.estimate(k) for k in mandatory)
                left = window_end - time.monotonic()
                if mandatory:
                    slack = max(0.0, left - need) / (len(mandatory) + 1)
                    gap = self.rng.uniform(0.2, 1.0) * min(slack, 4.0) + 0.1
                else:
                    gap = self.rng.uniform(0.5, 4.0)
                if left <= gap and not mandatory:
                    break
                self._sleep(gap)
        except Exception as exc:  # noqa: BLE001 — a harness error, reported as such
            ctx.errors.append(f"fault injector: {type(exc).__name__}: {exc}")
            import traceback

            traceback.print_exc()
        finally:
            self.recover_all()
            ctx.faults_done.set()

    def _sleep(self, seconds: float) -> None:
        self.ctx.stop.wait(max(0.0, seconds))

    # -- faults ----------------------------------------------------------------------------

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        fault = {"kind": kind, **fields}
        with self.ctx.lock:
            self.ctx.faults.append(fault)
        what = ", ".join(f"{k}={v}" for k, v in fields.items()
                         if k in ("sup", "job", "pid", "down_for", "stopped_for", "rc", "skipped",
                                  "mode"))
        self.ctx.log(f"fault {kind}: {what}")
        return fault

    def running_supervisor(self) -> SupervisorProc | None:
        running = [sp for sp in self.ctx.supervisors if sp.state == "running"
                   and sp.proc is not None and sp.proc.poll() is None]
        return self.rng.choice(running) if running else None

    def inject(self, kind: str) -> None:
        getattr(self, kind)()

    def child_kill(self) -> None:
        """SIGKILL of a running job's child, preferring long jobs; the first kill and every
        other one after it a chunk's process of 2 jobs or more (`chaos.chunked`,
        mid-chunk), when one runs within 3.5 s."""
        self.child_kills += 1
        prefer_chunk = self.child_kills % 2 == 1
        deadline = time.monotonic() + (4.0 if prefer_chunk else 3.0)
        wait_chunk = time.monotonic() + 3.5 if prefer_chunk else 0.0
        while time.monotonic() < deadline and not self.ctx.stop.is_set():
            candidates = []
            for sp in self.ctx.supervisors:
                if sp.state != "running" or sp.pid is None:
                    continue
                for pid, title, _ in job_children_of(sp.pid):
                    parts = title.split()
                    if len(parts) >= 4 and parts[:2] == ["forq:", "job"]:
                        candidates.append((sp, pid, parts[2], parts[3], False))
                    elif len(parts) >= 6 and parts[:3] == ["forq:", "chunk", "of"]:
                        candidates.append((sp, pid, parts[5], parts[4], parts[3] != "1"))
            chunks = [c for c in candidates if c[4]] if prefer_chunk else []
            if time.monotonic() < wait_chunk and not chunks:
                time.sleep(0.02)
                continue
            if candidates:
                long = [c for c in candidates if c[3] in LONG_TASKS]
                sp, pid, job, task, _many = self.rng.choice(chunks or long or candidates)
                # let the handler start (and record its execution) before killing it; a
                # chunk's jobs take 2-40 ms each: kill it after its first one or few
                time.sleep(self.rng.uniform(0.01, 0.05) if chunks else self.rng.uniform(0.02, 0.1))
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                # after the kill, not before: a chunk's process may start its next job
                # until the signal lands, and on a loaded host this thread can wait
                # between the two (the checker counts a job started by then as killed)
                at = time.time()
                inc = sp.current
                # a chunk's: its title names its first job; the checker finds the chunk
                self.record("child_kill", t=at, sup=sp.name, sup_id=inc.sup_id if inc else "",
                            pid=pid, job=job, task=task,
                            **({"chunk": True} if task == "chaos.chunked" else {}))
                self._sleep(self.ctx.settings.child_bound + 0.3)
                return
            time.sleep(0.05)
        self.record("child_kill", t=time.time(), skipped="no running child")

    def memhog(self) -> None:
        job = memhog_job(self.memhogs)
        self.memhogs += 1
        at = time.time()
        for _ in range(20):
            if enqueue_recorded(self.ctx, self.queue, [job], self.tries):
                break
            self._sleep(0.2)
        self.record("memhog", t=at, job=job["item"]["job_id"])
        self._sleep(0.5)

    def sup_kill(self) -> None:
        sp = self.running_supervisor()
        if sp is None:
            self.record("sup_kill", t=time.time(), skipped="no running supervisor")
            return
        s = self.ctx.settings
        with sp.lock:
            inc = sp.current
            at = sp.kill9()
        self.record("sup_kill", t=at, sup=sp.name, sup_id=inc.sup_id, pid=inc.pid)
        self._sleep(self.rng.uniform(0.5, 1.5))
        with sp.lock:
            new = sp.start()
        sp.wait_ready(20)
        self.ctx.faults[-1]["restarted"] = new.started
        self._sleep(max(0.0, at + s.reclaim_bound + 0.3 - time.time()))

    def sup_stop(self) -> None:
        sp = self.running_supervisor()
        if sp is None:
            self.record("sup_stop", t=time.time(), skipped="no running supervisor")
            return
        s = self.ctx.settings
        with sp.lock:
            inc = sp.current
            sp.state = "stopped"
            at = time.time()
            sp.signal(signal.SIGSTOP)
        stopped_for = s.lease_ttl + self.rng.uniform(0.5, 1.2)
        self._sleep(stopped_for)
        with sp.lock:
            sp.signal(signal.SIGCONT)
            cont = time.time()
            sp.state = "running"
        self.record("sup_stop", t=at, t_end=cont, sup=sp.name, sup_id=inc.sup_id, pid=inc.pid,
                    stopped_for=round(cont - at, 2))
        self._sleep(1.5)

    def sup_term(self) -> None:
        sp = self.running_supervisor()
        if sp is None:
            self.record("sup_term", t=time.time(), skipped="no running supervisor")
            return
        s = self.ctx.settings
        # drain_timeout, then SIGTERM/SIGKILL of the rest (2 s grace), then the reports
        limit = s.drain_timeout + 2.0 + 15.0 + 5.0
        with sp.lock:
            inc = sp.current
            at = time.time()
            rc = sp.drain(limit)
            if rc is None:
                sp.kill9()
                rc = "timeout"
        exited = inc.ended or time.time()
        self.record("sup_term", t=at, t_end=exited, sup=sp.name, sup_id=inc.sup_id, pid=inc.pid,
                    rc=rc, drain_s=round(exited - at, 2))
        with sp.lock:
            sp.start()
        sp.wait_ready(20)
        self._sleep(0.5)

    def redis_kill(self) -> None:
        r = self.ctx.redis
        at = time.time()
        r.kill9()
        down = time.time()
        self._sleep(self.rng.uniform(0.1, 0.6))
        try:
            up = r.start()
        finally:
            with self.ctx.lock:
                self.ctx.redis_outages.append([at, time.time()])
        self.record("redis_kill", t=at, t_end=up, killed=down, down_for=round(up - at, 2))
        self._sleep(1.0)

    def redis_stop(self) -> None:
        r = self.ctx.redis
        at = time.time()
        r.signal(signal.SIGSTOP)
        self._sleep(self.rng.uniform(1.0, 2.5))
        r.signal(signal.SIGCONT)
        up = time.time()
        with self.ctx.lock:
            self.ctx.redis_outages.append([at, up])
        self.record("redis_stop", t=at, t_end=up, down_for=round(up - at, 2))
        self._sleep(1.5)

    def redis_full(self) -> None:
        """Redis reaches maxmemory (noeviction) for a few seconds: the producer's enqueues
        are refused whole (QueueFull: not told, sent again), running jobs keep their
        leases and report, and claims resume when memory frees."""
        r = client(self.ctx.redis.url, 2)
        at = time.time()
        try:
            used = int(r.info("memory")["used_memory"])
        except redis.RedisError as exc:
            # a Redis just continued from a pause can miss the 2 s timeout on a loaded
            # host (it ended the injector 71 minutes into a 2-hour soak): no fault now
            self.record("redis_full", t=at, skipped=f"redis did not answer: {exc}")
            return
        r.config_set("maxmemory", max(1, used // 2))
        try:
            self._sleep(self.rng.uniform(1.5, 3.0))
        finally:
            self._unfill(r)
        self.record("redis_full", t=at, t_end=time.time())
        self._sleep(1.0)

    def _unfill(self, r: redis.Redis) -> None:
        """maxmemory back to none, retried for 30 s: a Redis left full would refuse
        every enqueue for the rest of the run (`recover_all` tries once more at the end)."""
        deadline = time.monotonic() + 30.0
        while True:
            try:
                r.config_set("maxmemory", 0)
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def partition(self) -> None:
        """One supervisor's path to Redis goes silent (blackhole, past its lease), slow
        or cut, then heals. It must fence its children before their leases can be
        reclaimed elsewhere, and carry on when the path is back."""
        sp = self.running_supervisor()
        if sp is None or sp.proxy is None:
            self.record("partition", t=time.time(), skipped="no running supervisor")
            return
        s = self.ctx.settings
        mode = self.rng.choice((BLACKHOLE, BLACKHOLE, SLOW, CUT))
        delay = round(self.rng.uniform(0.05, 0.3), 3) if mode == SLOW else 0.0
        lasting = (s.lease_ttl + self.rng.uniform(0.5, 1.5) if mode == BLACKHOLE
                   else self.rng.uniform(1.0, 2.5))
        inc = sp.current
        at = time.time()
        sp.proxy.set_mode(mode, delay)
        self._sleep(lasting)
        sp.proxy.set_mode(PASS)
        self.record("partition", t=at, t_end=time.time(), mode=mode, delay=delay,
                    sup=sp.name, sup_id=inc.sup_id if inc else "", pid=inc.pid if inc else 0)
        self._sleep(1.5)

    # -- end ---------------------------------------------------------------------------------

    def recover_all(self) -> None:
        """Leave everything up: Redis running, every supervisor running and continued."""
        r = self.ctx.redis
        try:
            r.signal(signal.SIGCONT)
            if r.proc is None or r.proc.poll() is not None:
                at = time.time()
                r.start()
                self.ctx.redis_outages.append([at, time.time()])
            client(r.url, 2).config_set("maxmemory", 0)
        except Exception as exc:  # noqa: BLE001
            self.ctx.errors.append(f"could not restart redis: {exc}")
        for sp in self.ctx.supervisors:
            if sp.proxy is not None:
                sp.proxy.set_mode(PASS)
            with sp.lock:
                if sp.state == "stopped":
                    sp.signal(signal.SIGCONT)
                    sp.state = "running"
                if sp.proc is None or sp.proc.poll() is not None:
                    if sp.state != "down":
                        sp.ended("exited", sp.proc.returncode if sp.proc else None)
                    sp.start()
                    sp.wait_ready(20)


def redis_ok(url: str) -> bool:
    try:
        return bool(client(url, 0.5).ping())
    except (redis.RedisError, OSError):
        return False
