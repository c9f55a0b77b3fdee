"""enqueue_many past one script call (`forq.store.pipelines.stream_enqueue`): the calls go
on one connection, the next sent while Redis runs the one before. What a pipeline
promised still holds: the order of the jobs, each job's own outcome, NOSCRIPT answered
by loading the script, and a connection lost midway costs no job and adds none."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from forq import PayloadError, Queue
from forq.store.connection import connect
from forq.store.transitions import ENQUEUE_BATCH
from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for
from tests.redis_server import RedisServer

OWNER = "host-a:100"
LONG = 60_000


def claimed_ids(queue: Queue) -> list[str]:
    ids: list[str] = []
    while leases := leasing(queue).claim(OWNER, 500, LONG).leases:
        ids += [lease.id for lease in leases]
    return ids


def noscript_errors(r: redis.Redis) -> int:
    return int(r.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0))


def cut_after_the_first_call(watcher: redis.Redis, pending: str, cut: dict[str, int]) -> None:
    """Once a call's jobs are pending (beyond the one warm-up job), drop every other
    client's connection; say how many jobs had landed and how many clients went."""
    wait_for(lambda: watcher.zcard(pending) > 1, timeout=30, interval=0.001,
             message="the first call's jobs")
    cut["landed"] = watcher.zcard(pending) - 1
    cut["killed"] = int(watcher.execute_command("CLIENT", "KILL", "TYPE", "normal",
                                                "SKIPME", "yes"))


def mixed_jobs(queue: Queue) -> list[dict[str, Any]]:
    """Four calls' worth: a duplicate in the second (of a job enqueued first), a delayed
    job in the third (the script's general path)."""
    queue.enqueue("t.first", job_id="taken")
    jobs: list[dict[str, Any]] = [{"task": "t.bulk", "args": [i]}
                                  for i in range(3 * ENQUEUE_BATCH + 100)]
    jobs[ENQUEUE_BATCH + 7]["job_id"] = "taken"
    jobs[2 * ENQUEUE_BATCH + 3]["delay"] = "1h"
    return jobs


def assert_each_outcome_in_order(queue: Queue, handles: list[Any]) -> None:
    statuses = [h.fields["enqueue_status"] for h in handles]
    assert statuses.count("pending") == len(handles) - 2
    assert statuses[ENQUEUE_BATCH + 7] == "duplicate" and handles[ENQUEUE_BATCH + 7].id == "taken"
    assert statuses[2 * ENQUEUE_BATCH + 3] == "scheduled"
    args = [queue.get(h.id).args for h in handles[ENQUEUE_BATCH - 2:ENQUEUE_BATCH + 2]]
    assert args == [[i] for i in range(ENQUEUE_BATCH - 2, ENQUEUE_BATCH + 2)]
    expected = ["taken"] + [h.id for i, h in enumerate(handles)
                            if statuses[i] == "pending"]
    assert claimed_ids(queue) == expected
    assert queue.name in queue.redis.smembers("forq:queues")


def assert_resent_once_in_order(queue: Queue, handles: list[Any], n: int) -> None:
    """After a cut and the client's retries: every job once, in order, and no more
    reported duplicate than two calls' worth (the two in flight)."""
    statuses = [h.fields["enqueue_status"] for h in handles]
    assert set(statuses) <= {"pending", "duplicate"}
    assert statuses.count("duplicate") <= 2 * ENQUEUE_BATCH
    assert len({h.id for h in handles}) == n
    assert claimed_ids(queue)[1:] == [h.id for h in handles]


def test_calls_keep_the_jobs_order_and_each_jobs_outcome(queue, r):
    assert_each_outcome_in_order(queue, queue.enqueue_many(mixed_jobs(queue)))


def test_an_error_reply_stops_the_calls_after_it_and_leaves_the_connection_in_step(queue, r):
    """A dependency on an unknown job refuses its whole call (lua/enqueue.lua); the
    call before it was applied, as in a pipeline, and so was the one sent while Redis
    ran the refused one; the fourth is never sent."""
    n = 4 * ENQUEUE_BATCH
    jobs = [{"task": "t.bulk", "args": [i]} for i in range(n)]
    jobs[ENQUEUE_BATCH + 1]["depends_on"] = ["no-such-parent"]
    with pytest.raises(PayloadError, match="no job no-such-parent"):
        queue.enqueue_many(jobs)
    landed = {int(queue.get(i).args[0]) // ENQUEUE_BATCH
              for i in r.zrange(queue.keys.pending, 0, -1)}
    assert landed == {0, 2}  # the calls' places: the first and the third
    # the reply of the call that was in flight was read: the next command gets its own
    assert queue.enqueue("t.after").fields["enqueue_status"] == "pending"
    assert r.zcard(queue.keys.pending) == 2 * ENQUEUE_BATCH + 1


def test_scripts_a_restarted_redis_forgot_are_loaded_and_the_calls_sent_again():
    """A private Redis: SCRIPT FLUSH must not disturb other tests. The client believes
    the script loaded (it loaded it once), so the first two calls come back NOSCRIPT."""
    with RedisServer() as server:
        queue = Queue("stream-noscript", url=server.url)
        n = 3 * ENQUEUE_BATCH
        first = queue.enqueue_many({"task": "t.a", "args": [i]} for i in range(n))
        queue.redis.script_flush()
        before = noscript_errors(queue.redis)
        second = queue.enqueue_many({"task": "t.b", "args": [i]} for i in range(n))
        assert noscript_errors(queue.redis) - before == 2  # the call sent and the one in flight
        assert {h.fields["enqueue_status"] for h in first + second} == {"pending"}
        assert claimed_ids(queue) == [h.id for h in first + second]


@pytest.mark.parametrize("retries", [0, 3])
def test_a_connection_cut_midway_loses_no_job_and_adds_none(retries):
    """Redis drops the producer's connection after its first call landed. With the
    client's retries (redis-py's `retry=`), the calls not read are sent again: every
    job is there once, in order, those that had landed reported duplicate. Without,
    the ConnectionError reaches the caller and the client's next command works."""
    with RedisServer() as server:
        client = connect(server.url, client_name="producer",
                         retry=Retry(NoBackoff(), retries))
        queue = Queue("stream-cut", redis=client)
        queue.enqueue("t.warm")  # loaded and registered: what follows is the stream alone
        watcher = connect(server.url)
        n = 40 * ENQUEUE_BATCH
        cut: dict[str, int] = {}
        killer = threading.Thread(target=cut_after_the_first_call,
                                  args=(watcher, queue.keys.pending, cut))
        killer.start()
        try:
            if retries:
                handles = queue.enqueue_many({"task": "t.bulk", "args": [i]} for i in range(n))
            else:
                with pytest.raises(redis.ConnectionError):
                    queue.enqueue_many({"task": "t.bulk", "args": [i]} for i in range(n))
        finally:
            killer.join(timeout=30)
        assert cut["killed"] >= 1 and cut["landed"] < n, cut  # it was cut midway
        if not retries:
            assert queue.enqueue("t.after").fields["enqueue_status"] == "pending"
            return
        assert_resent_once_in_order(queue, handles, n)


def test_the_ids_an_enqueue_many_makes_are_distinct_across_blocks_of_random_bytes(queue):
    handles = queue.enqueue_many([{"task": "t.bulk"}] * 1000)  # ids from 4 reads of 256
    ids = [h.id for h in handles]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 20 and int(i, 16) >= 0 for i in ids)
    assert len({i[:4] for i in ids}) > 500  # random, not counted up
