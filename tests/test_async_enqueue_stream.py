"""AsyncQueue.enqueue_many past one script call (`forq.store.pipelines.stream_enqueue_async`):
the sync client's promises (tests/test_enqueue_stream.py) on a ``redis.asyncio`` client —
the jobs' order and each one's outcome, nothing sent after an error reply, NOSCRIPT
answered by loading the script, a connection cut midway costing no job and adding none —
and one of its own: a task cancelled midway leaves the client in step."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from forq import AsyncQueue, PayloadError, Queue
from forq.async_queue import connect_async
from forq.store.connection import connect
from forq.store.transitions import ENQUEUE_BATCH
from tests.redis_server import RedisServer
from tests.test_enqueue_stream import (
    assert_each_outcome_in_order,
    assert_resent_once_in_order,
    claimed_ids,
    cut_after_the_first_call,
    mixed_jobs,
    noscript_errors,
)


def run(url: str, name: str, body: Callable[[AsyncQueue], Awaitable[Any]],
        **options: Any) -> Any:
    async def main() -> Any:
        async with AsyncQueue(name, redis=connect_async(url, **options)) as aq:
            try:
                return await body(aq)
            finally:
                await aq.redis.aclose()

    return asyncio.run(main())


def test_calls_keep_the_jobs_order_and_each_jobs_outcome(queue, redis_url):
    jobs = mixed_jobs(queue)
    assert_each_outcome_in_order(queue, run(redis_url, queue.name,
                                            lambda aq: aq.enqueue_many(jobs)))


def test_an_error_reply_stops_the_calls_after_it_and_leaves_the_connection_in_step(queue, r,
                                                                                   redis_url):
    n = 4 * ENQUEUE_BATCH
    jobs = [{"task": "t.bulk", "args": [i]} for i in range(n)]
    jobs[ENQUEUE_BATCH + 1]["depends_on"] = ["no-such-parent"]

    async def body(aq: AsyncQueue) -> str:
        with pytest.raises(PayloadError, match="no job no-such-parent"):
            await aq.enqueue_many(jobs)
        return (await aq.enqueue("t.after")).fields["enqueue_status"]

    assert run(redis_url, queue.name, body) == "pending"
    landed = {int(queue.get(i).args[0]) // ENQUEUE_BATCH
              for i in r.zrange(queue.keys.pending, 0, -1) if queue.get(i).task == "t.bulk"}
    assert landed == {0, 2}  # the first call, and the third sent while Redis ran the second
    assert r.zcard(queue.keys.pending) == 2 * ENQUEUE_BATCH + 1


def test_scripts_a_restarted_redis_forgot_are_loaded_and_the_calls_sent_again():
    with RedisServer() as server:
        queue = Queue("async-stream-noscript", url=server.url)
        n = 3 * ENQUEUE_BATCH

        async def body(aq: AsyncQueue) -> list[Any]:
            first = await aq.enqueue_many({"task": "t.a", "args": [i]} for i in range(n))
            await aq.redis.script_flush()
            before = noscript_errors(queue.redis)
            second = await aq.enqueue_many({"task": "t.b", "args": [i]} for i in range(n))
            assert noscript_errors(queue.redis) - before == 2  # the call sent, the one in flight
            return first + second

        handles = run(server.url, queue.name, body)
        assert {h.fields["enqueue_status"] for h in handles} == {"pending"}
        assert claimed_ids(queue) == [h.id for h in handles]


@pytest.mark.parametrize("retries", [0, 3])
def test_a_connection_cut_midway_loses_no_job_and_adds_none(retries):
    """As for the sync client: with redis-py's `retry=`, only the calls whose replies
    were not read are sent again; without, the ConnectionError reaches the caller and
    the client's next command gets its own reply."""
    with RedisServer() as server:
        queue = Queue("async-stream-cut", url=server.url)
        watcher = connect(server.url)
        n = 40 * ENQUEUE_BATCH
        cut: dict[str, int] = {}

        async def body(aq: AsyncQueue) -> Any:
            await aq.enqueue("t.warm")  # loaded and registered: what follows is the stream
            killer = threading.Thread(target=cut_after_the_first_call,
                                      args=(watcher, queue.keys.pending, cut))
            killer.start()
            try:
                if retries:
                    return await aq.enqueue_many({"task": "t.bulk", "args": [i]}
                                                 for i in range(n))
                with pytest.raises(redis.ConnectionError):
                    await aq.enqueue_many({"task": "t.bulk", "args": [i]} for i in range(n))
                return (await aq.enqueue("t.after")).fields["enqueue_status"]
            finally:
                await asyncio.to_thread(killer.join, 30)

        result = run(server.url, queue.name, body, retry=Retry(NoBackoff(), retries))
        assert cut["killed"] >= 1 and cut["landed"] < n, cut  # it was cut midway
        if not retries:
            assert result == "pending"
            return
        assert_resent_once_in_order(queue, result, n)


def test_a_task_cancelled_midway_leaves_the_client_in_step():
    """Cancelled while it waits for a reply, the task drops its connection, replies and
    all, so the next command reads its own, and only whole calls land. Redis is paused
    (writes) before the stream starts, so the task is in a read when it is cancelled: a
    cancel that lands in a send can be lost on Python < 3.12 (redis-py's `wait_for`,
    gh-86296), the task then runs to its end. A private Redis: the pause must not stall
    other tests' supervisors."""
    n = 40 * ENQUEUE_BATCH

    def reading(task: asyncio.Task[Any]) -> bool:
        """The task waits in `_read_async` (its coroutines' await chain says so)."""
        coro: Any = task.get_coro()
        while coro is not None:
            if getattr(coro, "__qualname__", "") == "_read_async":
                return True
            coro = getattr(coro, "cr_await", None)
        return False

    with RedisServer() as server:
        r = connect(server.url)
        pending = Queue("async-stream-cancel", redis=r).keys.pending

        def paused_behind_the_first() -> bool:
            """Redis holds the first call, and the second's bytes wait behind it."""
            return any(c["name"] == "stream-producer" and "b" in c["flags"]
                       and int(c["qbuf"]) for c in r.client_list())

        async def body(aq: AsyncQueue) -> str:
            await aq.enqueue("t.warm")
            r.client_pause(30_000, all=False)
            try:
                task = asyncio.create_task(aq.enqueue_many({"task": "t.bulk", "args": [i]}
                                                           for i in range(n)))
                deadline = time.monotonic() + 30
                while not (paused_behind_the_first() and reading(task)):
                    assert time.monotonic() < deadline and not task.done(), "two calls sent"
                    await asyncio.sleep(0.001)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                r.client_unpause()
            return (await aq.enqueue("t.after")).fields["enqueue_status"]

        assert run(server.url, "async-stream-cancel", body,
                   client_name="stream-producer") == "pending"
        landed = r.zcard(pending) - 2
        assert landed in (0, ENQUEUE_BATCH, 2 * ENQUEUE_BATCH), landed  # whole calls, sent
