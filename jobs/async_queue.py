"""The asyncio producer: `AsyncQueue`, the same calls as `Queue`, awaited.

It runs the same plans (`forq.store.plans`) and transitions (`forq.store.transitions`) as the sync
client, on ``redis.asyncio``; only sending differs. A FastAPI or aiohttp app holds one
`AsyncQueue` (or one client shared by several) for its lifetime:

    queue = AsyncQueue("emails", url="redis://127.0.0.1:6379/0")
    job = await queue.enqueue("emails.send", "ada@example.com")
    await job.wait(timeout=60)
    await queue.aclose()            # or: async with AsyncQueue(...) as queue
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel
from redis.exceptions import NoScriptError

from forq import batches
from forq.batches import AsyncBatch
from forq.errors import refused
from forq.job import Job, settled
from forq.payload import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    batch_specs,
    call_spec,
    checked_priority,
)
from forq.store import control, finder, plans, topology
from forq.store import events as queue_events
from forq.store import keys as keyspace
from forq.store import transitions as tr
from forq.store.batchspec import build_batch
from forq.store.connection import add_password, client_options, redis_url
from forq.store.events import AsyncQueueEvents
from forq.store.finder import BulkResult, FoundPage, JobFilter
from forq.store.keys import QueueKeys
from forq.store.pipelines import alone, queue_commands, regroup, stream_enqueue_async
from forq.store.plans import Command
from forq.store.scripts import noscript_resends, raise_first_error, source
from forq.store.transitions import DeadBatchResult

T = TypeVar("T")


def connect_async(url: str | None = None, *, password: str | None = None,
                  **kwargs: Any) -> aioredis.Redis:
    """A ``redis.asyncio`` client for redis://, rediss://, unix:// or redis+sentinel://
    URLs, with the same defaults and password rules as `forq.store.connection.connect`.
    Its connection pool opens connections on first use, in the running event loop."""
    url = redis_url(url)
    options = client_options(kwargs)
    if options.pop("cluster", False) or topology.scheme_of(url) in topology.CLUSTER_SCHEMES:
        raise ValueError("AsyncQueue does not support Redis Cluster yet: use Queue "
                         "(forq.Queue) for a redis+cluster:// URL")
    if topology.scheme_of(url) in topology.SENTINEL_SCHEMES:
        parts, sentinel_kwargs, options = topology.sentinel_settings(url, password, options)
        options.pop("health_check_interval", None)
        sentinel = Sentinel(parts["hosts"], sentinel_kwargs=sentinel_kwargs)
        master: aioredis.Redis = sentinel.master_for(parts["master"], **options)
        return master
    client: aioredis.Redis = aioredis.Redis.from_url(url, **options)
    add_password(client.connection_pool.connection_kwargs, password)
    return client


class AsyncScripts:
    """forq's transitions for one asyncio client: EVALSHA, and on NOSCRIPT (a restart,
    a failover, SCRIPT FLUSH) load the script and send it again — a NOSCRIPT call never
    ran, so sending it again cannot apply anything twice."""

    def __init__(self) -> None:
        self.sources = {name: source(name) for name in tr.TRANSITIONS}
        self.shas = {name: hashlib.sha1(text.encode()).hexdigest()
                     for name, text in self.sources.items()}

    def evalsha(self, call: tr.ScriptCall) -> tuple[Any, ...]:
        return ("EVALSHA", self.shas[call.script], len(call.keys), *call.keys, *call.args)

    async def run(self, client: aioredis.Redis, call: tr.ScriptCall) -> Any:
        try:
            return await client.execute_command(*self.evalsha(call))
        except NoScriptError:
            await self.load(client, call)
            return await client.execute_command(*self.evalsha(call))

    async def load(self, client: aioredis.Redis, call: tr.ScriptCall) -> None:
        """Load the script `call` runs: Redis forgot it (NOSCRIPT)."""
        await client.script_load(self.sources[call.script])

    async def send(self, client: aioredis.Redis, commands: Sequence[Command]) -> list[Any]:
        """One round trip for a batch (see `forq.store.pipelines`); raises the first error."""
        call = alone(commands)
        if call is not None:
            return [await self.run(client, call)]
        pipe = client.pipeline(transaction=False)
        counts = queue_commands(pipe, commands,
                                lambda c: pipe.execute_command(*self.evalsha(c)))
        stack = [(tuple(args), dict(options)) for args, options in pipe.command_stack]
        replies = await pipe.execute(raise_on_error=False)
        again = noscript_resends(stack, replies)
        if again:
            by_sha = {sha: name for name, sha in self.shas.items()}
            for sha in {stack[i][0][1] for i in again if isinstance(replies[i], NoScriptError)}:
                await client.script_load(self.sources[by_sha[str(sha)]])
            retry = client.pipeline(transaction=False)
            for i in again:
                retry.execute_command(*stack[i][0], **stack[i][1])
            for i, reply in zip(again, await retry.execute(raise_on_error=False), strict=True):
                replies[i] = reply
        raise_first_error(pipe, stack, replies)
        return regroup(replies, commands, counts)


@dataclass
class AsyncJob(Job):
    """A job handle from `AsyncQueue`: `await job.wait()`, `await job.refresh()`."""

    _async_queue: AsyncQueue | None = field(default=None, repr=False, compare=False)

    async def wait(self, timeout: float = 30.0, poll: float = 0.05) -> Any:
        """Wait (without blocking the loop) until the job finishes; its result, or
        `JobFailed` with the dead or cancel reason, or `JobTimeout`. Blocks on the
        queue's event stream as `Job.wait` does (one connection of the pool, for as
        long as it waits)."""
        queue = self._async_queue
        if queue is None:
            raise TypeError(f"job {self.id} has no queue to read from")
        record, history = await queue._run(queue_events.wait(
            queue.keys, self.id, timeout, poll, queue_events.socket_timeout(queue.redis)))
        return settled(queue._job(record, history), timeout, time.monotonic())[1]

    async def refresh(self) -> AsyncJob:  # type: ignore[override]
        """Re-read the record; returns the fresh snapshot."""
        if self._async_queue is None:
            raise TypeError(f"job {self.id} has no queue to read from")
        return await self._async_queue.get(self.id)


class AsyncQueue(AsyncQueueEvents):
    """One named queue on one Redis, for asyncio code: `Queue`'s producer calls, awaited.

    Pass `redis=` (a ``redis.asyncio.Redis``, e.g. one client for several queues) or
    `url=`; a client the queue opened itself is closed by `aclose()` / ``async with``.
    """

    def __init__(
        self,
        name: str = "default",
        redis: aioredis.Redis | None = None,
        url: str | None = None,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        min_replicas: int | None = None,
        wait_timeout: float | None = None,
    ) -> None:
        self.name = name
        self.keys = QueueKeys(name)
        self._owns_client = redis is None
        self.redis: aioredis.Redis = redis if redis is not None else connect_async(url)
        self.max_payload_bytes = max_payload_bytes
        self.scripts = AsyncScripts()
        self._registered = False
        self.min_replicas = min_replicas
        self.wait_timeout = wait_timeout

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client if this queue opened it (a shared one is its owner's)."""
        if self._owns_client:
            await self.redis.aclose()

    async def _run(self, plan: plans.Plan[T]) -> T:
        try:
            commands = next(plan)
            while True:
                commands = plan.send(await self.scripts.send(self.redis, commands))
        except StopIteration as done:
            result: T = done.value
            return result

    def _job(self, record: dict[str, str], history: list[str]) -> AsyncJob:
        job = AsyncJob.from_record(None, record, history)
        assert isinstance(job, AsyncJob)
        job._async_queue = self
        return job

    # -- producing ---------------------------------------------------------------

    async def enqueue(self, task: str, *args: Any, **options: Any) -> AsyncJob:
        """Enqueue one job; the options are `Queue.enqueue`'s. One round trip."""
        spec, durable = call_spec(task, args, options, self.max_payload_bytes)
        return (await self._enqueue_specs([spec], durable))[0]

    async def enqueue_many(self, jobs: Iterable[Mapping[str, Any]], *,
                           durable: bool | None = None) -> list[AsyncJob]:
        """Enqueue many jobs in few round trips, all validated before any is sent."""
        return await self._enqueue_specs(batch_specs(jobs, self.max_payload_bytes), durable)

    async def _enqueue_specs(self, specs: list[dict[str, Any]],
                             durable: bool | None) -> list[AsyncJob]:
        replicas, wait_ms = topology.durability(self.redis, durable, self.min_replicas,
                                                self.wait_timeout)
        try:
            if (not replicas and len(specs) > tr.ENQUEUE_BATCH
                    and not self.redis.single_connection_client):
                if not self._registered:
                    await self.redis.sadd(keyspace.QUEUES, self.name)
                    self._registered = True
                return await stream_enqueue_async(
                    self.redis, self.scripts.evalsha,
                    lambda call: self.scripts.load(self.redis, call), self.keys, specs,
                    lambda job_id, status: self._job(
                        {"id": job_id, "queue": self.name, "enqueue_status": status}, []))
            enqueued = await self._run(plans.enqueue(
                self.keys, specs, register=not self._registered, replicas=replicas,
                wait_ms=wait_ms))
        except aioredis.ResponseError as exc:
            raise refused(exc) from None
        self._registered = True
        return [self._job({"id": job_id, "queue": self.name, "enqueue_status": status}, [])
                for job_id, status in enqueued]

    async def batch(self, jobs: Iterable[Mapping[str, Any]], on_success: Any = None,
                    on_complete: Any = None, *, batch_id: str | None = None) -> AsyncBatch:
        """Enqueue `jobs` as one batch with its callbacks (see `Queue.batch`)."""
        spec = build_batch(self.name, jobs, on_success, on_complete, batch_id=batch_id,
                           max_payload_bytes=self.max_payload_bytes)
        try:
            await self._run(batches.open_batch(spec))
        except aioredis.ResponseError as exc:
            raise refused(exc) from None
        return AsyncBatch(self, spec.id, spec.member_ids)

    async def get_batch(self, batch_id: str) -> AsyncBatch:
        """The batch opened on this queue under `batch_id`; `JobNotFound` if none is."""
        status = await self._run(batches.read_batch(self.keys, batch_id, members=False))
        return AsyncBatch(self, status.id)

    # -- inspecting -------------------------------------------------------------

    async def get(self, job_id: str) -> AsyncJob:
        """The job's current record and history; `JobNotFound` if it does not exist."""
        return self._job(*await self._run(plans.get(self.keys, job_id)))

    async def wait(self, job_id: str, timeout: float = 30.0) -> Any:
        """The result of the job once it finished (see `AsyncJob.wait`)."""
        return await (await self.get(job_id)).wait(timeout)

    async def stats(self) -> dict[str, Any]:
        """Counts per state, totals, the last minute's outcomes, and the oldest wait."""
        return await self._run(plans.stats(self.keys))

    async def dead(self, limit: int = 100) -> list[AsyncJob]:
        """The oldest dead jobs, with their reasons."""
        return [self._job(record, history)
                for record, history in await self._run(plans.dead(self.keys, limit))]

    # -- finding jobs, and acting on all of them (forq.store.finder) ---------------------

    async def find(self, state: str = "pending", *, cursor: str | None = None, count: int = 100,
             **filters: Any) -> FoundPage:
        """One page of the jobs in `state` that pass the filters (task=, error= (a regular
        expression), since=, before=, args_contains=, group=: see `JobFilter`), in the
        order of the state's set, at most `count` in `page.jobs`. Pass `page.cursor` back
        for the next page; None means the walk is over. A page is bounded work: it may
        hold fewer than `count` jobs (even none) and a cursor when matches are sparse."""
        filt = JobFilter(state, **filters)
        page = await self._run(finder.find(self.keys, filt, cursor, count))
        page.jobs = [self._job(record, []) for record in page.records]
        return page

    async def find_iter(self, state: str = "pending", *, limit: int | None = None,
                  **filters: Any) -> AsyncIterator[AsyncJob]:
        """Every job in `state` that passes the filters (as `find`), page by page, up to
        `limit` jobs."""
        cursor: str | None = None
        seen = 0
        while True:
            page = await self.find(state, cursor=cursor, count=100, **filters)
            for job in page.jobs:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield job
            cursor = page.cursor
            if cursor is None:
                return

    async def bulk(self, action: str, state: str, *, limit: int | None = None,
             **filters: Any) -> BulkResult:
        """Do `action` to every job in `state` that passes the filters (as `find`), up to
        `limit`: "requeue" or "purge" (dead jobs), "cancel" (pending, scheduled, waiting
        or active), "promote" (scheduled). Each job is one atomic call: a match that
        changed before its turn (another state, its record trimmed) is skipped, counted
        in `result.skipped`."""
        return await self._run(finder.act(self.keys, JobFilter(state, **filters), action, limit))

    # -- operator actions ----------------------------------------------------------

    async def cancel(self, job_id: str) -> str:
        """"cancelled", "cancelling" (active), "missing", or its terminal state."""
        return tr.parse_cancel(await self._run(plans.script(tr.cancel_call(self.keys, job_id))))

    async def promote(self, job_id: str) -> str:
        """Run a scheduled job now (a delayed one, or a retry waiting out its backoff): it
        becomes pending at the tail of its priority. Returns "pending"; `JobStateError`
        when the job is not scheduled, `JobNotFound` when there is none."""
        return (await self._run(plans.change(self.keys, tr.promote_call(self.keys, job_id),
                                            job_id))).state

    async def reschedule(self, job_id: str, at: Any = None, *, delay: Any = None) -> str:
        """Give a pending or scheduled job a new run-at: `at` (a datetime or Unix seconds)
        or `delay` (a duration from now, by Redis's clock). A time not in the future runs
        it now. Returns its state then ("scheduled" or "pending"); `JobStateError` when it
        is in another state (a waiting job runs when its dependencies end) or its expiry
        before start would come first."""
        ms, relative = plans.new_run_at(at, delay)
        return (await self._run(plans.change(
            self.keys, tr.reschedule_call(self.keys, job_id, ms, relative), job_id))).state

    async def set_priority(self, job_id: str, priority: int) -> str:
        """Change the priority of a pending, scheduled or waiting job (higher runs first):
        a pending one moves to the tail of its new priority at once. Returns its state;
        `JobStateError` when it is running or finished."""
        priority = checked_priority(priority)
        return (await self._run(plans.change(
            self.keys, tr.set_priority_call(self.keys, job_id, priority), job_id))).state

    async def pause(self) -> bool:
        """Stop claiming from this queue on every supervisor (see `Queue.pause`)."""
        return tr.parse_changed(await self._run(plans.script(tr.pause_call(self.keys))))

    async def resume(self, task: str | None = None) -> bool:
        """Claim from this queue again, supervisors woken at once (`Queue.resume`)."""
        if task is not None:
            return await self._run(plans.resume_task(self.keys, task))
        return tr.parse_changed(await self._run(plans.script(tr.resume_call(self.keys))))

    async def is_paused(self) -> bool:
        return await self._run(plans.paused(self.keys))

    async def throttle(self, duration: Any, *, group: str | None = None) -> float:
        """Throttle the queue (or `group`) on every supervisor (see `Queue.throttle`)."""
        until_ms = await self._run(plans.script(control.set_throttle_call(
            self.keys, plans.throttle_ms(duration), group)))
        return int(until_ms) / 1000

    async def unthrottle(self, *, group: str | None = None) -> bool:
        """Lift the queue's (or `group`'s) throttle (see `Queue.unthrottle`)."""
        return tr.parse_changed(await self._run(plans.script(
            control.set_throttle_call(self.keys, 0, group))))

    async def throttled(self, *, group: str | None = None) -> float | None:
        """Seconds until the queue's (or `group`'s) throttle ends, None when none is."""
        return await self._run(plans.throttled(self.keys, group))

    async def requeue_dead(self, ids: Sequence[str] | None = None, *,
                           limit: int = 10000) -> DeadBatchResult:
        """Requeue the given dead jobs (or all, up to `limit`): (count, ids not dead)."""
        return tr.parse_dead_batch(await self._run(
            plans.script(tr.requeue_dead_call(self.keys, ids, limit))))

    async def purge_dead(self, ids: Sequence[str] | None = None, *,
                         limit: int = 10000) -> DeadBatchResult:
        """Delete the given dead jobs (or all, up to `limit`): (count, ids not dead)."""
        return tr.parse_dead_batch(await self._run(
            plans.script(tr.purge_dead_call(self.keys, ids, limit))))
