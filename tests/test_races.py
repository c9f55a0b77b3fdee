"""Real concurrency against a real Redis: threads, each with its own client, racing the
Lua transitions. Leases of a few milliseconds make the races happen thousands of times
in a few seconds; the assertions are the invariants the design promises:

* extension (or ack) and reclaim never both win on one lease;
* no job is ever leased twice at once, reclaimed twice, or lost;
* crashes are counted exactly, and a job that keeps crashing ends in dead.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

from forq import Queue
from forq.store.connection import connect
from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for

LONG = 60_000


def redis_ms(r) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def run_threads(targets: list[Callable[[], None]], timeout: float = 90.0) -> None:
    """Start every target at once; re-raise the first error any of them hit."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(targets))

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                start.wait(timeout=10)
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported to the test below
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(fn), daemon=True) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a racing thread did not finish"
    if errors:
        raise errors[0]


def own_queue(name: str, url: str) -> Queue:
    """A Queue on its own connection: racing threads never share a socket."""
    return Queue(name, redis=connect(url))


def location(queue: Queue, job_id: str) -> list[str]:
    pipe = queue.redis.pipeline(transaction=False)
    for key in (queue.keys.pending, queue.keys.scheduled, queue.keys.active, queue.keys.dead):
        pipe.zscore(key, job_id)
    names = ("pending", "scheduled", "active", "dead")
    return [n for n, score in zip(names, pipe.execute(), strict=True) if score is not None]


class Duel:
    """Two threads that meet at a barrier every round: one runs `left`, one `right`."""

    def __init__(self, left: Callable[[int], object], right: Callable[[int], object]) -> None:
        self.fns = (left, right)
        self.go = threading.Barrier(3, timeout=10)
        self.done = threading.Barrier(3, timeout=10)
        self.results: list[object] = [None, None]
        self.round = -1
        self.stop = False
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                        for i in range(2)]
        for t in self.threads:
            t.start()

    def _loop(self, side: int) -> None:
        while True:
            self.go.wait()
            if self.stop:
                return
            try:
                self.results[side] = self.fns[side](self.round)
            except BaseException as exc:  # noqa: BLE001 - re-raised by play()
                self.errors.append(exc)
            self.done.wait()

    def play(self, n: int) -> tuple[object, object]:
        self.round = n
        self.results = [None, None]
        self.go.wait()
        self.done.wait()
        if self.errors:
            raise self.errors[0]
        return self.results[0], self.results[1]

    def close(self) -> None:
        self.stop = True
        self.go.wait()
        for t in self.threads:
            t.join(10)


def test_extend_racing_reclaim_never_both_win(queue, redis_url):
    """Thousands of rounds: a 1-3 ms lease, then extend and reclaim at the same moment.
    Either the extension kept the lease (the job stays active under the same token with
    the long deadline) or the reaper moved the job back to pending and the extension was
    told "lost" — never both, never neither, and the job is always in exactly one place."""
    rounds = 2000
    jid = queue.enqueue("t.race", max_crashes=10 ** 6).id
    extender = own_queue(queue.name, redis_url)
    reaper = own_queue(queue.name, redis_url)
    tokens: dict[int, str] = {}
    rng = random.Random(7)
    delays = [rng.randrange(0, 9) for _ in range(rounds)]

    def extend(n: int) -> list[str]:
        for _ in range(delays[n]):  # spread the extension over the lease's last moments
            extender.redis.ping()
        lost, _cancelled, _now = leasing(extender).extend([(jid, tokens[n])], LONG)
        extender_done.set()
        return lost

    def reclaim(n: int) -> list[str]:
        moved: list[str] = []
        while not moved and not extender_done.is_set():
            moved = leasing(reaper).reclaim("reaper")[3]
        if not moved:
            moved = leasing(reaper).reclaim("reaper")[3]
        return moved

    extender_done = threading.Event()
    duel = Duel(extend, reclaim)
    wins = {"extend": 0, "reclaim": 0}
    crashes = 0
    try:
        for n in range(rounds):
            extender_done.clear()
            lease = leasing(queue).claim("sup", 1, 1 + n % 3).leases[0]
            assert lease.id == jid
            tokens[n] = lease.token
            lost, moved = duel.play(n)
            extended = lost == []
            reclaimed = moved == [jid]
            assert extended != reclaimed, f"round {n}: extended={extended} reclaimed={reclaimed}"
            where = location(queue, jid)
            f = queue.redis.hgetall(queue.keys.job(jid))
            if extended:
                wins["extend"] += 1
                assert where == ["active"], (n, where)
                assert f["state"] == "active" and f["token"] == lease.token
                assert int(f["lease_deadline"]) > redis_ms(queue.redis) + LONG // 2
                assert leasing(queue).release(jid, lease.token) == "ok"
            else:
                wins["reclaim"] += 1
                crashes += 1
                assert lost == [jid]
                assert where == ["pending"], (n, where)
                assert f["state"] == "pending" and "token" not in f
            assert int(f["crashes"]) == crashes
    finally:
        duel.close()
    assert wins["extend"] + wins["reclaim"] == rounds
    # both outcomes really happened: the race was exercised, not one side every time
    assert wins["extend"] > 0 and wins["reclaim"] > 0, wins
    assert queue.get(jid).crashes == wins["reclaim"]


def test_ack_racing_reclaim_never_both_win(queue, redis_url):
    """The same race with the ack: a job is either succeeded (ack "ok") or back in
    pending with a crash counted (ack "lost"), never both."""
    rounds = 500
    ids = [j.id for j in queue.enqueue_many({"task": "t.race", "args": [i]}
                                            for i in range(rounds))]
    acker = own_queue(queue.name, redis_url)
    reaper = own_queue(queue.name, redis_url)
    leases: dict[int, tuple[str, str]] = {}
    delays = [random.Random(11 + i).randrange(0, 9) for i in range(rounds)]
    acker_done = threading.Event()

    def ack(n: int) -> str:
        for _ in range(delays[n]):
            acker.redis.ping()
        reply = leasing(acker).ack(*leases[n], '"ok"')
        acker_done.set()
        return reply

    def reclaim(n: int) -> list[str]:
        moved: list[str] = []
        while not moved and not acker_done.is_set():
            moved = leasing(reaper).reclaim("reaper")[3]
        return moved or leasing(reaper).reclaim("reaper")[3]

    duel = Duel(ack, reclaim)
    outcome = {"ack": 0, "reclaim": 0}
    try:
        for n in range(rounds):
            acker_done.clear()
            lease = leasing(queue).claim("sup", 1, 1 + n % 3).leases[0]
            leases[n] = (lease.id, lease.token)
            reply, moved = duel.play(n)
            assert (reply == "ok") != (moved == [lease.id]), (n, reply, moved)
            f = queue.redis.hgetall(queue.keys.job(lease.id))
            if reply == "ok":
                outcome["ack"] += 1
                assert f["state"] == "succeeded" and location(queue, lease.id) == []
                assert f["crashes"] == "0"
            else:
                outcome["reclaim"] += 1
                assert reply == "lost"
                assert f["state"] == "pending" and location(queue, lease.id) == ["pending"]
                assert "result" not in f and f["crashes"] == "1"
                # take it out of the way so the next round claims the next job
                assert queue.cancel(lease.id) == "cancelled"
    finally:
        duel.close()
    assert outcome["ack"] > 0 and outcome["reclaim"] > 0, outcome
    assert {queue.get(i).state for i in ids} <= {"succeeded", "cancelled"}


@pytest.mark.parametrize("claimers", [2, 4])
def test_concurrent_claimers_never_lease_a_job_twice(queue, redis_url, claimers):
    n = 3000
    ids = [j.id for j in queue.enqueue_many({"task": "t.x", "args": [i]} for i in range(n))]
    got: list[list[tuple[str, str]]] = [[] for _ in range(claimers)]

    def claimer(i: int) -> Callable[[], None]:
        q = own_queue(queue.name, redis_url)
        rng = random.Random(i)

        def run() -> None:
            while True:
                result = leasing(q).claim(f"sup-{i}", rng.randint(1, 40), LONG)
                got[i] += [(lease.id, lease.token) for lease in result.leases]
                if not result.leases and result.pending_left == 0:
                    return
        return run

    run_threads([claimer(i) for i in range(claimers)])
    leased = [jid for part in got for jid, _ in part]
    assert len(leased) == len(set(leased)) == n, "a job was leased twice, or not at all"
    assert set(leased) == set(ids)
    tokens = [token for part in got for _, token in part]
    assert len(set(tokens)) == n
    assert queue.redis.zcard(queue.keys.active) == n
    assert queue.redis.zcard(queue.keys.pending) == 0
    # every record agrees with the claimer that got it
    pipe = queue.redis.pipeline(transaction=False)
    for part in got:
        for jid, _ in part:
            pipe.hmget(queue.keys.job(jid), "state", "owner", "token")
    records = iter(pipe.execute())
    for i, part in enumerate(got):
        for _jid, token in part:
            assert next(records) == ["active", f"sup-{i}", token]


def test_concurrent_reapers_reclaim_each_lease_exactly_once(queue, redis_url):
    n, reapers = 2000, 6
    ids = [j.id for j in queue.enqueue_many({"task": "t.x"} for _ in range(n))]
    deadline = 0
    while True:
        leases = leasing(queue).claim("sup", 500, 1).leases
        if not leases:
            break
        deadline = max(deadline, *(int(lease.job.fields["lease_deadline"]) for lease in leases))
    assert queue.redis.zcard(queue.keys.active) == n
    wait_for(lambda: redis_ms(queue.redis) > deadline, timeout=10, interval=0.002)
    moved: list[list[str]] = [[] for _ in range(reapers)]
    counts = [[0, 0, 0] for _ in range(reapers)]

    def reaper(i: int) -> Callable[[], None]:
        q = own_queue(queue.name, redis_url)
        rng = random.Random(i)

        def run() -> None:
            while True:
                to_pending, to_dead, completed, got = leasing(q).reclaim(f"reaper-{i}",
                                                                 limit=rng.randint(5, 80))
                if not got:
                    return
                moved[i] += got
                counts[i][0] += to_pending
                counts[i][1] += to_dead
                counts[i][2] += completed
        return run

    run_threads([reaper(i) for i in range(reapers)])
    everything = [jid for part in moved for jid in part]
    assert len(everything) == len(set(everything)) == n, "a lease was reclaimed twice"
    assert set(everything) == set(ids)
    assert sum(c[0] for c in counts) == n and sum(c[1] + c[2] for c in counts) == 0
    r = queue.redis
    assert r.zcard(queue.keys.active) == 0 and r.zcard(queue.keys.pending) == n
    pipe = r.pipeline(transaction=False)
    for jid in ids:
        pipe.hmget(queue.keys.job(jid), "state", "crashes")
        pipe.lrange(queue.keys.history(jid), 0, -1)
    replies = pipe.execute()
    for (state, crashes_count), history in zip(replies[::2], replies[1::2], strict=True):
        assert (state, crashes_count) == ("pending", "1")
        assert sum('"event":"reclaimed"' in h for h in history) == 1
    assert queue.stats()["totals"]["crashed"] == n


def test_crash_loops_end_in_dead_with_exact_counts(queue, redis_url):
    """Workers keep claiming jobs that "crash" (reported by expire, or silently by letting
    a 1-5 ms lease lapse) while several reapers reclaim concurrently: every job is
    claimed exactly max_crashes times and ends dead with its last crash as the reason."""
    n, max_crashes = 300, 3
    ids = [j.id for j in queue.enqueue_many({"task": "t.poison", "max_crashes": max_crashes}
                                            for _ in range(n))]
    stop = threading.Event()
    claims: list[list[str]] = [[] for _ in range(3)]

    def worker(i: int) -> Callable[[], None]:
        q = own_queue(queue.name, redis_url)
        rng = random.Random(100 + i)

        def run() -> None:
            while not stop.is_set():
                leases = leasing(q).claim(f"sup-{i}", rng.randint(1, 20), rng.randint(1, 5)).leases
                if not leases:
                    stop.wait(0.0005)  # idle: let the reapers catch up
                    continue
                for lease in leases:
                    claims[i].append(lease.id)
                    if rng.random() < 0.6:
                        reply = leasing(q).expire(lease.id, lease.token, f"killed by SIGKILL (sup-{i})")
                        # a reaper may already have taken the lapsed lease
                        assert reply in ("ok", "lost")
        return run

    def reaper(i: int) -> Callable[[], None]:
        q = own_queue(queue.name, redis_url)

        def run() -> None:
            while not stop.is_set():
                if not leasing(q).reclaim(f"reaper-{i}", default_max_crashes=99, limit=50)[3]:
                    stop.wait(0.0005)
        return run

    def watcher() -> None:
        try:
            wait_for(lambda: queue.redis.zcard(queue.keys.dead) == n, timeout=60,
                     message="every poison job dead")
        finally:
            stop.set()

    run_threads([worker(i) for i in range(3)] + [reaper(i) for i in range(2)] + [watcher])
    r = queue.redis
    assert r.zcard(queue.keys.pending) == r.zcard(queue.keys.active) == 0
    assert r.zcard(queue.keys.scheduled) == 0
    all_claims = [jid for part in claims for jid in part]
    assert len(all_claims) == n * max_crashes
    assert {jid: all_claims.count(jid) for jid in set(all_claims)} == dict.fromkeys(ids, 3)
    for jid in ids:
        job = queue.get(jid)
        assert job.state == "dead" and job.crashes == max_crashes
        kinds = [e["event"] for e in job.history]
        assert kinds.count("claimed") == 3
        assert kinds.count("reclaimed") == 2 and kinds[-1] == "dead"
        # the reason is the last crash's: the child's report, or the lapsed lease
        last_claim = max(i for i, k in enumerate(kinds) if k == "claimed")
        reported = [e for e in job.history[last_claim:] if e["event"] == "crashed"]
        owner = job.history[last_claim]["owner"]
        expected = (reported[-1]["reason"] if reported
                    else f"lease expired (owner {owner})")
        assert job.reason == f"{expected} (crashes exhausted: 3)"
    totals = queue.stats()["totals"]
    assert totals["crashed"] == n * max_crashes and totals["dead"] == n
