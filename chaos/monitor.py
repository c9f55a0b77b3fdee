"""The monitor: while chaos runs, look at Redis about once a second.

* A consistent snapshot (one read-only script, so atomic) of the pending, scheduled,
  active and dead sets: no job in two sets, every member's record in that state.
* No active lease held by a supervisor that died more than
  lease_ttl + reaper_interval (+ tolerance) ago.
* A supervisor that exits on its own (not killed or drained by chaos) is recorded
  and restarted.
* Each ended job's record is copied as it enters its queue's retention index, before
  the reaper trims it (`Context.kept`): a soak's short window (chaos/soak.py) trims
  within seconds, and the defaults' counts (10,000 succeeded and 10,000 dead records a
  queue) within a run of ten minutes.
"""

from __future__ import annotations

import threading
import time

import redis

from forq.store.keys import QueueKeys

from .context import OTHER_QUEUE, QUEUE, Context
from .producer import client

SNAPSHOT = """
local prefix = ARGV[1]
local sets = {'pending', 'scheduled', 'active', 'dead'}
local seen = {}
local bad = {}
local active = {}
local counts = {}
for _, s in ipairs(sets) do
  local ids = redis.call('ZRANGE', prefix .. s, 0, -1, 'WITHSCORES')
  counts[#counts + 1] = #ids / 2
  for i = 1, #ids, 2 do
    local id = ids[i]
    if seen[id] then
      bad[#bad + 1] = id .. ' is in both ' .. seen[id] .. ' and ' .. s
    else
      seen[id] = s
    end
    local f = redis.call('HMGET', prefix .. 'job:' .. id, 'state', 'owner')
    if f[1] ~= s then
      bad[#bad + 1] = id .. ' is in ' .. s .. ' but its record says ' .. tostring(f[1])
    end
    if s == 'active' then
      active[#active + 1] = id
      active[#active + 1] = tostring(f[2])
      active[#active + 1] = ids[i + 1]
    end
  end
end
local t = redis.call('TIME')
return {bad, active, counts, t[1] .. '.' .. string.format('%06d', tonumber(t[2]))}
"""


def run_queue_wait(pid: int) -> float | None:
    """Seconds `pid`'s main thread has spent runnable but waiting for a CPU."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def cpu_pressure() -> float | None:
    try:
        with open("/proc/pressure/cpu") as f:
            return float(f.readline().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return None


class Probe(threading.Thread):
    """Sample every supervisor's run-queue wait a few times a second: when a lease is
    lost or a reclaim is late with no injected fault, the checker can tell a host that
    starved the supervisor of CPU (other load on the machine) from a bug in forq."""

    def __init__(self, ctx: Context, interval: float = 0.2) -> None:
        super().__init__(name="probe", daemon=True)
        self.ctx = ctx
        self.interval = interval

    def run(self) -> None:
        n = 0
        r = client(self.ctx.redis.url, timeout=1.0)
        while not self.ctx.stop.wait(self.interval):
            self.ping(r)
            now = time.time()
            for sp in self.ctx.supervisors:
                pid = sp.pid
                if pid is None:
                    continue
                wait = run_queue_wait(pid)
                if wait is not None:
                    runs = self.ctx.sched.setdefault(pid, [[]])
                    if runs[-1] and wait < runs[-1][-1][1]:
                        runs.append([])  # a new process with a recycled pid
                    runs[-1].append((now, wait))
            n += 1
            if n % 5 == 0:
                psi = cpu_pressure()
                if psi is not None:
                    self.ctx.cpu_pressure.append((now, psi))


    def ping(self, r) -> None:
        """Record when Redis answers slowly (> 250 ms) or not at all: an injected outage,
        or a host whose disk makes `appendfsync always` stall."""
        t0 = time.time()
        try:
            r.ping()
        except (redis.RedisError, OSError):
            pass
        t1 = time.time()
        if t1 - t0 > 0.25:
            slow = self.ctx.redis_slow
            if slow and t0 - slow[-1][1] < self.interval * 2:
                slow[-1][1] = t1
            else:
                slow.append([t0, t1])


class Monitor(threading.Thread):
    def __init__(self, ctx: Context, interval: float = 1.0) -> None:
        super().__init__(name="monitor", daemon=True)
        self.ctx = ctx
        self.interval = interval
        self.keys = QueueKeys(QUEUE)
        self.flagged: set[tuple[str, str]] = set()
        self.snapshots = 0
        self.failed_snapshots = 0
        self.copied: dict[str, float] = {}  # ended job -> the index score it was copied at
        self.floor: dict[str, float] = {}  # retention bucket -> highest score copied

    def run(self) -> None:
        r = client(self.ctx.redis.url, timeout=1.0)
        script = r.register_script(SNAPSHOT)
        while not self.ctx.stop.wait(self.interval):
            try:
                self.check_supervisors()
                self.snapshot(script)
                self.keep(r)
            except Exception as exc:  # noqa: BLE001
                self.ctx.errors.append(f"monitor: {type(exc).__name__}: {exc}")

    def check_supervisors(self) -> None:
        for sp in self.ctx.supervisors:
            if not sp.lock.acquire(blocking=False):
                continue  # the injector is acting on it
            try:
                if sp.state in ("running", "stopped") and sp.proc is not None \
                        and sp.proc.poll() is not None:
                    inc = sp.current
                    rc = sp.proc.returncode
                    sp.ended("exited", rc)
                    self.ctx.unexpected_exits.append(
                        {"sup": sp.name, "sup_id": inc.sup_id if inc else "", "rc": rc,
                         "t": time.time()})
                    self.ctx.log(f"supervisor {sp.name} exited on its own (rc {rc}); restarting")
                    sp.start()
            finally:
                sp.lock.release()

    def snapshot(self, script) -> None:
        try:
            bad, active, counts, now = script(args=[self.keys.prefix])
        except (redis.RedisError, OSError):
            self.failed_snapshots += 1
            return
        self.snapshots += 1
        now = float(now)
        self.ctx.samples.append({"t": now, "pending": counts[0], "scheduled": counts[1],
                                 "active": counts[2], "dead": counts[3]})
        for problem in bad:
            self.violation("two states", problem, now)
        dead = self.ctx.dead_supervisors()
        bound = self.ctx.settings.reclaim_bound
        for i in range(0, len(active), 3):
            job, owner = active[i], active[i + 1]
            died = dead.get(owner)
            if died is not None and now - died > bound:
                self.violation("lease of a dead supervisor",
                               f"{job} still leased to {owner}, dead for {now - died:.1f}s "
                               f"(bound {bound:.2f}s)", now, key=(job, owner))

    def keep(self, r) -> None:
        """Copy the records that entered a retention index since the last look: each
        bucket is scored by when its records may go, rising for its new entries."""
        try:
            for name in (QUEUE, OTHER_QUEUE):
                keys = QueueKeys(name)
                for bucket in r.smembers(keys.kept):
                    zset = keys.kept_bucket(bucket)
                    fresh = [(jid, score) for jid, score in r.zrangebyscore(
                        zset, self.floor.get(zset, "-inf"), "+inf", withscores=True)
                        if self.copied.get(jid) != score]
                    if not fresh:
                        continue
                    pipe = r.pipeline(transaction=False)
                    for jid, _ in fresh:
                        pipe.hgetall(keys.job(jid))
                        pipe.lrange(keys.history(jid), 0, -1)
                    replies = pipe.execute()
                    for i, (jid, score) in enumerate(fresh):
                        if replies[2 * i]:
                            self.ctx.kept[jid] = (name, replies[2 * i], replies[2 * i + 1])
                            self.copied[jid] = score
                    self.floor[zset] = max(score for _, score in fresh)
        except (redis.RedisError, OSError):
            pass  # Redis down or full (a fault): the next look copies what this one missed

    def violation(self, kind: str, detail: str, at: float, key: tuple[str, str] | None = None) -> None:
        key = key or (kind, detail)
        if key in self.flagged:
            return
        self.flagged.add(key)
        self.ctx.monitor_violations.append({"kind": kind, "detail": detail, "t": at})
        self.ctx.log(f"VIOLATION {kind}: {detail}")
