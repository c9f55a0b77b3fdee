"""AsyncQueue against a real Redis: every call, and the same records as the sync client.

Each test runs its coroutine with `asyncio.run` (a fresh loop, as an app's would be);
the lease side is played by the sync `Queue`, which the supervisor uses.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from forq import AsyncJob, AsyncQueue, JobFailed, JobNotFound, JobTimeout, NotReplicated, Queue
from forq.errors import PayloadError
from forq.store.transitions import ENQUEUE_BATCH
from forq.supervisor.leases.calls import leasing
from tests.redis_server import DEFAULT_TEST_URL

OWNER = "async-test"
LONG = 60_000


def run(queue: Queue, body: Callable[[AsyncQueue], Awaitable[Any]]) -> Any:
    """Run `body` with an AsyncQueue on the same queue, closing its client after."""
    async def main() -> Any:
        async with AsyncQueue(queue.name, url=os.environ.get("FORQ_REDIS_URL", DEFAULT_TEST_URL)) as aq:
            return await body(aq)

    return asyncio.run(main())


def test_enqueue_writes_what_the_sync_client_reads(queue):
    async def body(aq):
        job = await aq.enqueue("emails.send", "ada@example.com", priority=5, key="once")
        again = await aq.enqueue("emails.send", "ada@example.com", key="once")
        later = await aq.enqueue("reports.build", kwargs={"month": "2026-11"}, delay="30s")
        return job, again, later

    job, again, later = run(queue, body)
    assert isinstance(job, AsyncJob)
    assert job.fields["enqueue_status"] == "pending"
    assert (again.id, again.fields["enqueue_status"]) == (job.id, "duplicate")
    assert later.fields["enqueue_status"] == "scheduled"
    record = queue.get(job.id)
    assert (record.task, record.args, record.state, record.fields["priority"]) == (
        "emails.send", ["ada@example.com"], "pending", 5)
    assert queue.get(later.id).kwargs == {"month": "2026-11"}
    assert queue.name in queue.redis.smembers("forq:queues")


def test_enqueue_many_spans_several_script_calls(queue):
    n = ENQUEUE_BATCH * 2 + 7

    async def body(aq):
        return await aq.enqueue_many({"task": "t.n", "args": [i]} for i in range(n))

    jobs = run(queue, body)
    assert len(jobs) == n and len({j.id for j in jobs}) == n
    assert queue.stats()["pending"] == n
    assert queue.get(jobs[-1].id).args == [n - 1]


def test_bad_input_is_refused_before_anything_is_sent(queue):
    async def body(aq):
        with pytest.raises(PayloadError, match=r"jobs\[1\]: .*args\[0\] is not JSON"):
            await aq.enqueue_many([{"task": "ok"}, {"task": "bad", "args": [object()]}])
        with pytest.raises(PayloadError, match="unknown option"):
            await aq.enqueue("t", colour="red")
        with pytest.raises(TypeError, match="positionally or as args="):
            await aq.enqueue("t", 1, args=[2])

    run(queue, body)
    assert queue.stats()["pending"] == 0


def test_get_wait_and_failures(queue):
    async def body(aq):
        ok, bad, slow = (await aq.enqueue("t.ok", keep_history=True), await aq.enqueue("t.bad"),
                         await aq.enqueue("t.slow"))
        leases = {lease.id: lease for lease in leasing(queue).claim(OWNER, 3, LONG).leases}

        async def finish() -> None:
            await asyncio.sleep(0.05)  # let the waiters start polling first
            leasing(queue).ack(ok.id, leases[ok.id].token, json.dumps({"sent": 3}))
            leasing(queue).fail(bad.id, leases[bad.id].token, {"message": "no such mailbox"},
                       mode="fatal")

        waited = await asyncio.gather(ok.wait(timeout=5), aq.wait(bad.id, timeout=5),
                                      finish(), return_exceptions=True)
        assert waited[0] == {"sent": 3}
        assert isinstance(waited[1], JobFailed) and "no such mailbox" in str(waited[1])
        with pytest.raises(JobTimeout, match="still active"):
            await slow.wait(timeout=0.2)
        fresh = await ok.refresh()
        assert fresh.state == "succeeded" and fresh.history[-1]["event"] == "succeeded"
        with pytest.raises(JobNotFound):
            await aq.get("no-such-job")

    run(queue, body)


def test_stats_dead_requeue_purge_cancel(queue):
    async def body(aq):
        a, b, c, d = [await aq.enqueue("t.x", i) for i in range(4)]
        for lease in leasing(queue).claim(OWNER, 3, LONG).leases:
            leasing(queue).fail(lease.id, lease.token, {"message": "bad"}, mode="fatal")
        stats = await aq.stats()
        assert (stats["dead"], stats["pending"]) == (3, 1)
        dead = await aq.dead()
        assert sorted(j.id for j in dead) == sorted([a.id, b.id, c.id])
        assert all(j.reason == "bad" for j in dead)
        assert await aq.requeue_dead([a.id, d.id]) == (1, [d.id])
        assert await aq.purge_dead() == (2, [])
        assert await aq.cancel(d.id) == "cancelled"
        assert await aq.cancel("no-such-job") == "missing"
        stats = await aq.stats()
        assert (stats["dead"], stats["pending"]) == (0, 1)

    run(queue, body)


def test_scripts_are_reloaded_after_script_flush(queue):
    async def body(aq):
        await aq.enqueue("t.first")
        await aq.redis.script_flush()
        single = await aq.enqueue("t.alone")  # one EVALSHA, answered NOSCRIPT
        await aq.redis.script_flush()
        many = await aq.enqueue_many([{"task": "t.many"}] * (ENQUEUE_BATCH + 1))  # a pipeline
        await aq.redis.script_flush()
        assert await aq.cancel(single.id) == "cancelled"
        return many

    many = run(queue, body)
    assert len(many) == ENQUEUE_BATCH + 1
    assert queue.stats()["pending"] == ENQUEUE_BATCH + 2


def test_durable_enqueue_without_replicas_names_the_jobs(queue):
    async def body(aq):
        with pytest.raises(NotReplicated, match="not replicated: 0 of 1") as caught:
            await aq.enqueue("t.d", job_id="durable-1", durable=True)
        return caught.value

    error = run(queue, body)
    assert error.job_ids == ["durable-1"]
    assert queue.get("durable-1").state == "pending"  # the master has it


def test_a_shared_client_outlives_its_queues(queue, redis_url):
    from forq.async_queue import connect_async

    async def main() -> int:
        client = connect_async(redis_url)
        try:
            async with AsyncQueue(queue.name, redis=client) as first:
                await first.enqueue("t.one")
            second = AsyncQueue(queue.name, redis=client)
            await second.enqueue("t.two")  # the first queue did not close the client
            return int((await second.stats())["pending"])
        finally:
            await client.aclose()

    assert asyncio.run(main()) == 2


def test_cluster_urls_are_refused_in_one_line():
    with pytest.raises(ValueError, match="does not support Redis Cluster yet: use Queue"):
        AsyncQueue("q", url="redis+cluster://127.0.0.1:7000")
