"""The producer: a seeded mix of jobs enqueued at a target rate.

Only an id whose enqueue call *returned* is recorded as told. An enqueue that raised
(Redis down or paused) is retried with the same job id — enqueue is idempotent by id,
so a try that had in fact landed comes back as "duplicate" and is told then.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from typing import Any

import redis

from forq import Queue, QueueFull

from .chunks import build_burst
from .context import OTHER_QUEUE, QUEUE, Context, Told

# kind -> share of the mix
MIX = {
    "quick": 0.13,
    "slow": 0.10,
    "cpu": 0.06,
    "flaky": 0.12,
    "crashy": 0.10,
    "idem": 0.16,
    "idem-option": 0.06,
    "fatal": 0.04,
    "hostile": 0.06,  # escapees, output floods, garbage on the result pipe
    "steps": 0.04,  # three durable steps, some crashing between the second and the third
    "batch": 0.03,  # a batch of 2-5 members with on_complete and on_success callbacks
    "grouped": 0.05,  # one of GROUPS groups (group_concurrency 1): never two at once
    "moved": 0.04,  # delayed; promoted, rescheduled, reprioritised while it waits (operator)
    "snoozy": 0.03,  # puts itself off (raise Retry) 1-3 times; past max_snoozes, dead
    "throttler": 0.02,  # throttles its group (or the queue) once or twice, then succeeds
    "dependent": 0.03,  # depends_on 1-3 jobs enqueued just before; reads their results
    "debounced": 0.04,  # key= one of DEBOUNCE_KEYS, debounce=: the last call's arguments run
    "chunked": 0.02,  # a burst of 3-12 jobs of a task(chunk=8) (chaos/chunks.py)
}
GROUPS = 6
DEBOUNCE_KEYS = 3
DEBOUNCE = "150ms"
# what a batch's members do: each with the end its kind expects (some crash, some fail)
BATCH_MEMBER_KINDS = ("quick", "quick", "slow", "cpu", "flaky", "crashy")
# what the members of a batch opened by a member's handler do (current().batch)
INNER_MEMBER_KINDS = ("quick", "quick", "crashy", "flaky", "fatal")


def build_job(rng: random.Random, seq: int, kind: str, max_attempts: int,
              max_crashes: int, slow_ms: tuple[float, float] = (300, 3000)) -> dict[str, Any]:
    """One job: its enqueue item plus what the checker should expect of it."""
    kwargs: dict[str, Any] = {}
    options: dict[str, Any] = {}
    expect = "succeed"
    idem = False
    if kind == "quick":
        task, kwargs["ms"] = "chaos.quick", round(rng.uniform(0, 20), 1)
    elif kind == "slow":
        task, kwargs["ms"] = "chaos.slow", round(rng.uniform(*slow_ms))
    elif kind == "cpu":
        task, kwargs["ms"] = "chaos.cpu", round(rng.uniform(50, 200))
    elif kind == "flaky":
        task = "chaos.flaky"
        fail_times = rng.choice([1, 1, 2, 2, max_attempts])
        kwargs["fail_times"] = fail_times
        if fail_times >= max_attempts:
            expect = "dead:attempts"
    elif kind == "crashy":
        task = "chaos.crashy"
        crash_times = rng.choice([1, 1, 2, max_crashes])
        kwargs["crash_times"] = crash_times
        if crash_times >= max_crashes:
            expect = "dead:crashes"
    elif kind == "idem":
        # a task declared idempotent (@task(..., idempotent=True))
        task, kwargs["ms"], idem = "chaos.idem", round(rng.uniform(50, 1500)), True
        if rng.random() < 0.2:
            kwargs["crash_times"] = 1
    elif kind == "idem-option":
        # an ordinary task made idempotent per job: enqueue(..., idempotent=True)
        task = rng.choice(["chaos.quick", "chaos.slow"])
        kwargs["ms"] = round(rng.uniform(5, 20) if task == "chaos.quick"
                             else rng.uniform(300, 1500))
        kwargs["idem"] = True
        options["idempotent"] = True
        idem = True
    elif kind == "fatal":
        task, expect = "chaos.fatal", "dead:fatal"
    elif kind == "hostile":
        task, attack = "chaos.hostile", rng.choice(["escapee", "flood", "garbage"])
        kwargs["attack"] = attack
        if attack == "garbage":  # its crashes are malformed messages, not exits
            crash_times = rng.choice([1, 2, max_crashes])
            kwargs["crash_times"] = crash_times
            if crash_times >= max_crashes:
                expect = "dead:crashes"
    elif kind == "grouped":
        task, kwargs["ms"] = "chaos.slow", round(rng.uniform(50, 600))
        options["group"] = f"g{rng.randrange(GROUPS)}"
    elif kind == "moved":
        task, kwargs["ms"] = "chaos.moved", round(rng.uniform(0, 20), 1)
        options["delay"] = rng.choice(["1s", "3s", "6s", "10s"])
        options["priority"] = rng.randint(-3, 3)
        if rng.random() < 0.5:
            options["lifo"] = True
        if rng.random() < 0.3:
            options["group"] = f"g{rng.randrange(GROUPS)}"
    elif kind == "snoozy":
        task = "chaos.snoozy"
        kwargs["snooze_times"] = rng.choice([1, 1, 2, 3])
        kwargs["ms"] = round(rng.uniform(20, 300))
        if rng.random() < 0.2:
            options["max_snoozes"] = kwargs["snooze_times"] - 1
            expect = "dead:snoozes"
    elif kind == "throttler":
        task = "chaos.throttler"
        kwargs["scope"] = rng.choice(["group", "group", "queue"])
        kwargs["ms"] = round(rng.uniform(30, 250))
        kwargs["throttle_times"] = rng.choice([1, 1, 2])
        if kwargs["scope"] == "group":
            options["group"] = f"g{rng.randrange(GROUPS)}"
    elif kind == "dependent":
        task, kwargs["ms"] = "chaos.dependent", round(rng.uniform(0, 20), 1)
    elif kind == "debounced":
        # a burst of calls with one key: one run (or one more while one runs), the latest
        # call's v in it; the id returned may be another call's (the job holding the key)
        task, kwargs["v"] = "chaos.debounced", seq
        options.update(key=f"deb-{rng.randrange(DEBOUNCE_KEYS)}", debounce=DEBOUNCE)
    elif kind == "steps":
        task = "chaos.steps"
        crash_times = rng.choice([0, 1, 1, 2, max_crashes])
        kwargs["crash_times"] = crash_times
        if crash_times >= max_crashes:
            expect = "dead:crashes"
    else:
        raise ValueError(kind)
    item = {"task": task, "kwargs": kwargs, "job_id": f"j{seq:06d}-{kind}", **options}
    return {"item": item, "kind": kind, "expect": expect, "idem": idem}


def build_dependent(rng: random.Random, seq: int, max_attempts: int,
                    max_crashes: int) -> list[dict[str, Any]]:
    """A job with depends_on, after its 1-3 parents (quick ones, or ones failing once:
    they succeed unless a fault kills them past max_crashes), enqueued before it in the
    same call or an earlier one."""
    parents = []
    for k in range(rng.randint(1, 3)):
        job = build_job(rng, seq, rng.choice(["quick", "quick", "flaky"]), max_attempts,
                        max_crashes)
        job["item"]["job_id"] = f"j{seq:06d}-parent{k + 1}"
        if job["kind"] == "flaky":
            job["item"]["kwargs"]["fail_times"] = 1
            job["expect"] = "succeed"
        job["parent_of"] = f"j{seq:06d}-dependent"
        parents.append(job)
    child = build_job(rng, seq, "dependent", max_attempts, max_crashes)
    child["item"]["depends_on"] = [p["item"]["job_id"] for p in parents]
    return [*parents, child]


def build_batch(rng: random.Random, seq: int, max_attempts: int, max_crashes: int,
                slow_ms: tuple[float, float] = (300, 3000), nested: float = 0.3) -> dict[str, Any]:
    """A batch: 2-5 members (quick, slow, cpu, flaky, crashy; in about a third of the
    batches one poison member too, so that many batches fail; in `nested` of them a member
    that opens a batch of 1-3 of its own, with an on_complete; in 3 of 10 a slow member on
    another queue), and its two callbacks.
    Its members' ids are forq's (batch id and place), its callbacks' the batch id and
    the callback's name."""
    bid = f"b{seq:06d}"
    members = []
    for _ in range(rng.randint(2, 5)):
        members.append(build_job(rng, seq, rng.choice(BATCH_MEMBER_KINDS), max_attempts,
                                 max_crashes, slow_ms))
    if rng.random() < 0.35:
        members.insert(rng.randint(0, len(members)),
                       build_job(rng, seq, "fatal", max_attempts, max_crashes))
    if rng.random() < nested:
        # a member that opens a batch of its own: it ends here once that batch is done
        inner = [build_job(rng, seq, rng.choice(INNER_MEMBER_KINDS), max_attempts, max_crashes)
                 for _ in range(rng.randint(1, 3))]
        for job in inner:
            del job["item"]["job_id"]
        members.insert(rng.randint(0, len(members)), {
            "item": {"task": "chaos.batch_opener",
                     "kwargs": {"inner": [job["item"] for job in inner],
                                "crash_times": 1 if rng.random() < 0.3 else 0}},
            "kind": "batch", "expect": "succeed", "idem": False, "inner": inner})
    for job in members:
        job["item"].pop("job_id", None)  # a member's id is the batch's and its place: forq's
    if rng.random() < 0.3:
        # a slow member on another queue, often the last to end: its end reaches the
        # batch through that queue's relay, which a reaper pass delivers
        job = build_job(rng, seq, "slow", max_attempts, max_crashes, slow_ms)
        del job["item"]["job_id"]
        job["item"]["queue"] = job["queue"] = OTHER_QUEUE
        members.insert(rng.randint(0, len(members)), job)
    callbacks = {role: {"task": "chaos.batch_callback",
                        "kwargs": {"role": role,
                                   "crash_times": 1 if rng.random() < 0.25 else 0}}
                 for role in ("on_complete", "on_success")}
    return {"batch": bid, "kind": "batch", "members": members, **callbacks}


def memhog_job(seq: int) -> dict[str, Any]:
    item = {"task": "chaos.memhog", "kwargs": {"megabytes": 1024}, "job_id": f"m{seq:04d}-memhog",
            "memory_limit": "128MiB", "max_attempts": 2}
    return {"item": item, "kind": "memhog", "expect": "dead:memory", "idem": False,
            "max_attempts": 2}


def client(url: str, timeout: float = 1.0) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout,
                                socket_connect_timeout=timeout)


def enqueue_recorded(ctx: Context, queue: Queue, jobs: list[dict[str, Any]],
                     tries: dict[str, int]) -> bool:
    """Enqueue a batch; record each as told only if the call returned. False on error."""
    for job in jobs:
        tries[job["item"]["job_id"]] = tries.get(job["item"]["job_id"], 0) + 1
    try:
        handles = queue.enqueue_many([j["item"] for j in jobs])
    except (redis.RedisError, OSError, QueueFull):
        with ctx.lock:
            ctx.enqueue_errors += 1
            for job in jobs:
                ctx.not_told[job["item"]["job_id"]] = tries[job["item"]["job_id"]]
        return False
    now = time.time()
    s = ctx.settings
    for job, handle in zip(jobs, handles, strict=True):
        jid = job["item"]["job_id"]
        status = handle.fields.get("enqueue_status", "")
        if job["kind"] == "debounced":  # the job that holds the key may be another's
            with ctx.lock:
                ctx.not_told.pop(jid, None)
                ctx.debounce_calls.append([job["item"]["key"], job["item"]["kwargs"]["v"],
                                           handle.id, status])
        else:
            assert handle.id == jid, (handle.id, jid)
        ctx.add_told(Told(handle.id, job["kind"], job["item"]["task"], job["expect"],
                          job["idem"], job.get("max_attempts", s.max_attempts), s.max_crashes,
                          now, tries=tries[jid], status=status, queue=queue.name))
    return True


def enqueue_batch_recorded(ctx: Context, queue: Queue, batch: dict[str, Any],
                           tries: dict[str, int], early: bool = False) -> bool:
    """Open a batch; once `Queue.batch` returned, record its members and its on_complete
    as told, and its on_success as told conditionally (enqueued only if every member
    succeeds). Opening it again after an error is safe: a batch id opens once, whole
    (all its members are on this queue: one script). False on error.

    `early` (the broken build ``early-callback``): the producer enqueues the batch's
    on_complete itself first, as a build whose batch count fired early would."""
    bid = batch["batch"]
    tries[bid] = tries.get(bid, 0) + 1
    ids = [f"{bid}-{i}" for i in range(1, len(batch["members"]) + 1)]
    ids += [f"{bid}-on_complete", f"{bid}-on_success"]
    try:
        if early:
            queue.enqueue("chaos.batch_callback", kwargs={"batch_id": bid, "role": "on_complete"},
                          job_id=f"{bid}-on_complete")
        opened = queue.batch([m["item"] for m in batch["members"]],
                             on_success=batch["on_success"], on_complete=batch["on_complete"],
                             batch_id=bid)
    except (redis.RedisError, OSError, QueueFull):
        with ctx.lock:
            ctx.enqueue_errors += 1
            for jid in ids:
                ctx.not_told[jid] = tries[bid]
        return False
    now = time.time()
    s = ctx.settings
    assert opened.member_ids == ids[:-2], (opened.member_ids, ids)
    for jid, member in zip(opened.member_ids, batch["members"], strict=True):
        ctx.add_told(Told(jid, "batch", member["item"]["task"], member["expect"], False,
                          s.max_attempts, s.max_crashes, now, tries=tries[bid], batch=bid,
                          queue=member.get("queue", QUEUE)))
    for opener, member in zip(opened.member_ids, batch["members"], strict=True):
        # told conditionally: opened with the opener's ack, so only if that lands
        inner = f"{opener}-b"
        for k, job in enumerate(member.get("inner", ()), 1):
            ctx.add_told(Told(f"{inner}-{k}", "batch", job["item"]["task"], job["expect"], False,
                              s.max_attempts, s.max_crashes, now, tries=tries[bid],
                              batch=inner, optional=True))
        if member.get("inner"):
            ctx.add_told(Told(f"{inner}-on_complete", "batch-cb", "chaos.batch_callback",
                              "succeed", False, s.max_attempts, s.max_crashes, now,
                              tries=tries[bid], batch=inner, optional=True))
    for role in ("on_complete", "on_success"):
        ctx.add_told(Told(f"{bid}-{role}", "batch-cb", "chaos.batch_callback", "succeed",
                          False, s.max_attempts, s.max_crashes, now, tries=tries[bid],
                          batch=bid, optional=role == "on_success"))
    return True


class Producer(threading.Thread):
    def __init__(self, ctx: Context) -> None:
        super().__init__(name="producer", daemon=True)
        self.ctx = ctx
        s = ctx.settings
        self.rng = random.Random(f"{s.seed}-producer")
        self.total = s.total_jobs()
        self.rate = s.job_rate()
        kinds, weights = zip(*MIX.items(), strict=True)
        self.plan = []
        for i in range(self.total):
            kind = self.rng.choices(kinds, weights)[0]
            if kind == "dependent":  # its parents first, in the plan's order
                self.plan.extend(build_dependent(self.rng, i, s.max_attempts, s.max_crashes))
                continue
            if kind == "chunked":  # issued at once, enqueued in one call: run in chunks
                self.plan.append({"burst": build_burst(self.rng, i, OTHER_QUEUE)})
                continue
            self.plan.append(
                build_batch(self.rng, i, s.max_attempts, s.max_crashes, s.slow_ms,
                            s.nested_batches)
                if kind == "batch" else
                build_job(self.rng, i, kind, s.max_attempts, s.max_crashes, s.slow_ms))
        self.total = len(self.plan)
        self.drop: set[int] = set()
        if "drop-job" in s.breaks and self.total:
            # the broken producer: says these are enqueued, never sends them (single jobs)
            step = max(1, self.total // 4)
            for k in range(3):
                i = min(self.total - 1, step * k + step // 2)
                # never a parent: its dependent's enqueue would be refused
                while i < self.total - 1 and ("batch" in self.plan[i] or "burst" in self.plan[i]
                                              or "parent_of" in self.plan[i]):
                    i += 1
                self.drop.add(i)
        self.early_callbacks = 2 if "early-callback" in s.breaks else 0
        self.backlog: list[dict[str, Any]] = []
        self.issued = 0

    def run(self) -> None:
        ctx = self.ctx
        queue = Queue(QUEUE, redis=client(ctx.redis.url))
        queues = {QUEUE: queue, OTHER_QUEUE: Queue(OTHER_QUEUE, redis=queue.redis)}
        tries: dict[str, int] = {}
        start = time.monotonic()
        end_issue = start + ctx.settings.duration
        try:
            while not ctx.stop.is_set():
                now = time.monotonic()
                due = min(self.total, int((now - start) * self.rate) + 1)
                if now >= end_issue:
                    due = self.issued  # the production window is over: no new jobs
                while self.issued < due:
                    job = self.plan[self.issued]
                    if self.issued in self.drop:
                        ctx.add_told(Told(job["item"]["job_id"], job["kind"],
                                          job["item"]["task"], job["expect"], job["idem"],
                                          ctx.settings.max_attempts, ctx.settings.max_crashes,
                                          time.time(), status="dropped"))
                    else:
                        self.backlog.extend(job.get("burst", [job]))
                    self.issued += 1
                if self.backlog:
                    if "batch" in self.backlog[0]:
                        sent = enqueue_batch_recorded(ctx, queue, self.backlog[0], tries,
                                                      early=self.early_callbacks > 0)
                        chunk = self.backlog[:1]
                        if sent and self.early_callbacks:
                            self.early_callbacks -= 1
                    else:  # one call: jobs of one queue (a burst of chunked ones whole)
                        on = self.backlog[0].get("queue", QUEUE)
                        chunk = list(itertools.takewhile(
                            lambda j, on=on: "batch" not in j and j.get("queue", QUEUE) == on,
                            self.backlog[:100]))
                        sent = enqueue_recorded(ctx, queues[on], chunk, tries)
                    if sent:
                        del self.backlog[:len(chunk)]
                    else:
                        time.sleep(0.1)
                        continue
                if self.issued >= self.total or now >= end_issue:
                    if not self.backlog:
                        break
                time.sleep(0.02)
        finally:
            ctx.production_done.set()
            ctx.log(f"producer: {self.issued} issued, {len(ctx.told)} told, "
                    f"{len(self.backlog)} never told")
