"""Sending a plan's commands (`forq.store.plans`): the part the sync and async clients share,
and the sync client's runner; and `stream_enqueue` (sync) and `stream_enqueue_async`,
a big enqueue_many's calls two in flight on one connection.

A batch of one transition is sent alone (EVALSHA, reloaded on NOSCRIPT: one round
trip); anything else goes in one non-transactional pipeline. Queueing a command on a
pipeline does no I/O in redis-py's sync and asyncio clients alike, so `queue_commands`
and `regroup` serve both; only `execute` differs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from redis.exceptions import NoScriptError, ResponseError

from forq.store import topology
from forq.store import transitions as tr
from forq.store.keys import QueueKeys
from forq.store.plans import Command, Plan, WaitReplicas
from forq.store.scripts import ForqRedis, Scripts, loaded_shas
from forq.store.transitions import ScriptCall

T = TypeVar("T")


def alone(commands: Sequence[Command]) -> ScriptCall | None:
    """The transition to send by itself, when the batch is just that."""
    if len(commands) == 1 and isinstance(commands[0], ScriptCall):
        return commands[0]
    return None


def queue_commands(pipe: Any, commands: Sequence[Command],
                   queue_script: Callable[[ScriptCall], Any]) -> list[int]:
    """Queue every command on `pipe`; returns how many replies each will have (a WAIT
    goes to every cluster node that owns one of its keys)."""
    counts = []
    for command in commands:
        if isinstance(command, ScriptCall):
            queue_script(command)
            counts.append(1)
        elif isinstance(command, WaitReplicas):
            counts.append(topology.queue_wait(pipe, command.replicas, command.timeout_ms,
                                              command.keys))
        else:
            pipe.execute_command(*command)
            counts.append(1)
    return counts


def regroup(replies: Sequence[Any], commands: Sequence[Command], counts: list[int]) -> list[Any]:
    """One reply per command: a `WaitReplicas` gets the list of its WAIT replies."""
    out, at = [], 0
    for command, n in zip(commands, counts, strict=True):
        out.append(list(replies[at:at + n]) if isinstance(command, WaitReplicas) else replies[at])
        at += n
    return out


def send(client: Any, scripts: Scripts, commands: Sequence[Command]) -> list[Any]:
    """One round trip for a batch; raises the first error a command got."""
    call = alone(commands)
    if call is not None:
        return [scripts.run(call)]
    pipe = client.pipeline(transaction=False)
    counts = queue_commands(pipe, commands, lambda c: scripts.run(c, pipe))
    return regroup(pipe.execute(), commands, counts)


def run_plan(client: Any, scripts: Scripts, plan: Plan[T]) -> T:
    """Drive a plan to its result, one round trip per batch it yields."""
    try:
        commands = next(plan)
        while True:
            commands = plan.send(send(client, scripts, commands))
    except StopIteration as done:
        result: T = done.value
        return result


# -- many calls with two in flight ---------------------------------------------------


def can_stream(client: Any) -> bool:
    """A plain (not cluster) sync client: one connection reaches every key."""
    return isinstance(client, ForqRedis)


def stream_enqueue(client: Any, scripts: Scripts, keys: QueueKeys,
                   specs: Sequence[dict[str, Any]], handle: Callable[[str, str], T]) -> list[T]:
    """Enqueue validated specs in `ENQUEUE_BATCH` calls on one connection, the next call
    built and sent while Redis runs the one before, and each reply read and turned into
    the jobs' `handle(id, status)` while Redis runs the next: the producer's CPU and
    Redis's overlap, where one pipeline does all the client's work before and after all
    of Redis's (bench/addbulk.py; the sync `Queue.enqueue_many`, past one call).
    Raises the first error reply, as a pipeline does (the calls before it were applied).
    """
    calls = stream_calls(client, scripts, lambda: tr.iter_enqueue_calls(keys, specs),
                         _enqueued(specs, handle))
    return [job for call_jobs in calls for job in call_jobs]


def _enqueued(specs: Sequence[dict[str, Any]],
              handle: Callable[[str, str], T]) -> Callable[[int, Any], list[T]]:
    """The jobs of enqueue call k, from its reply."""
    def jobs(k: int, reply: Any) -> list[T]:
        ids = [spec["id"] for spec in specs[k * tr.ENQUEUE_BATCH:(k + 1) * tr.ENQUEUE_BATCH]]
        return [handle(job.id, job.status) for job in tr.parse_enqueue(reply, ids)]
    return jobs


def stream_calls(client: Any, scripts: Scripts, calls: Callable[[], Iterator[ScriptCall]],
                 on_reply: Callable[[int, Any], T]) -> list[T]:
    """Send `calls()` on one connection, two in flight, and `on_reply(k, reply)` for each.
    After an error reply nothing more is sent (the call sent while Redis ran it has run);
    a call answered NOSCRIPT (Redis forgot its script: it never ran) is sent again once
    the script is loaded, and so are the calls after it. After a connection error, when
    the client retries (as redis-py retries a pipeline), the calls whose replies were not
    read are sent again: each enqueue is idempotent by job id, so a job that had landed
    comes back a duplicate."""
    pool = client.connection_pool
    conn = pool.get_connection()
    done: dict[int, T] = {}
    reloaded = False

    def run() -> None:
        nonlocal reloaded
        while True:
            error = _send_overlapped(client, conn, scripts, calls(), on_reply, done)
            if error is None:
                return
            if isinstance(error, NoScriptError) and not reloaded:
                reloaded = True
                loaded_shas(pool).clear()  # the server forgot them all: load on next use
                continue
            raise error

    try:
        conn.retry.call_with_retry(run, lambda _error: conn.disconnect())
    finally:
        pool.release(conn)
    return [done[k] for k in range(len(done))]


def _send_overlapped(client: Any, conn: Any, scripts: Scripts, calls: Iterator[ScriptCall],
                     on_reply: Callable[[int, Any], T], done: dict[int, T]) -> Exception | None:
    """Send the calls not `done` yet, each before reading the reply of the one before;
    put each reply's `on_reply` in `done`. Returns the first error reply (and sends
    nothing after it), None when every call is done."""
    loaded = loaded_shas(client.connection_pool)
    in_flight: list[int] = []
    error: Exception | None = None
    try:
        for k, call in enumerate(calls):
            if k in done:
                continue
            script = scripts.script(call)
            if script.sha not in loaded:
                client.script_load(script.script)  # on another connection: this one is busy
                loaded.add(script.sha)
            # no health-check PING while a reply is in flight: it would read that reply
            conn.send_packed_command(conn.pack_command(
                "EVALSHA", script.sha, len(call.keys), *call.keys, *call.args),
                check_health=not in_flight)
            in_flight.append(k)
            if len(in_flight) == 2:  # read the one before while Redis runs this one
                error = _read(client, conn, in_flight.pop(0), on_reply, done)
                if error is not None:
                    break
        while in_flight:
            late = _read(client, conn, in_flight.pop(0), on_reply, done)
            error = error or late
    except BaseException:
        if in_flight:  # replies left on the wire: this socket is out of step
            conn.disconnect()
        raise
    return error


def _read(client: Any, conn: Any, k: int, on_reply: Callable[[int, Any], T],
          done: dict[int, T]) -> Exception | None:
    try:
        reply = client.parse_response(conn, "EVALSHA")
    except ResponseError as error:
        return error
    done[k] = on_reply(k, reply)
    return None


# -- the same on a redis.asyncio client (`AsyncQueue.enqueue_many`) ------------------


async def stream_enqueue_async(client: Any, evalsha: Callable[[ScriptCall], tuple[Any, ...]],
                               load: Callable[[ScriptCall], Awaitable[Any]], keys: QueueKeys,
                               specs: Sequence[dict[str, Any]],
                               handle: Callable[[str, str], T]) -> list[T]:
    """`stream_enqueue` on a ``redis.asyncio`` client that takes its connections from a
    pool: `evalsha(call)` is the command, `load(call)` loads its script after NOSCRIPT."""
    calls = await stream_calls_async(client, evalsha, load,
                                     lambda: tr.iter_enqueue_calls(keys, specs),
                                     _enqueued(specs, handle))
    return [job for call_jobs in calls for job in call_jobs]


async def stream_calls_async(client: Any, evalsha: Callable[[ScriptCall], tuple[Any, ...]],
                             load: Callable[[ScriptCall], Awaitable[Any]],
                             calls: Callable[[], Iterator[ScriptCall]],
                             on_reply: Callable[[int, Any], T]) -> list[T]:
    """`stream_calls` for asyncio, with the same promises: nothing sent after an error
    reply, a NOSCRIPT call sent again once its script is loaded, and after a connection
    error the client's retries send again only the calls whose replies were not read.
    A cancelled task leaves no reply on the wire: the connection is dropped."""
    pool = client.connection_pool
    conn = await pool.get_connection()
    done: dict[int, T] = {}
    reloaded = False

    async def run() -> None:
        nonlocal reloaded
        while True:
            error, call = await _send_overlapped_async(client, conn, evalsha, calls(),
                                                       on_reply, done)
            if error is None:
                return
            if isinstance(error, NoScriptError) and not reloaded and call is not None:
                reloaded = True
                await load(call)
                continue
            raise error

    async def disconnect(_error: Exception) -> None:
        await conn.disconnect()

    try:
        await conn.retry.call_with_retry(run, disconnect)
    finally:
        await pool.release(conn)
    return [done[k] for k in range(len(done))]


async def _send_overlapped_async(
        client: Any, conn: Any, evalsha: Callable[[ScriptCall], tuple[Any, ...]],
        calls: Iterator[ScriptCall], on_reply: Callable[[int, Any], T],
        done: dict[int, T]) -> tuple[Exception | None, ScriptCall | None]:
    """`_send_overlapped` for asyncio; the first error reply comes with its call."""
    in_flight: list[tuple[int, ScriptCall]] = []
    error: Exception | None = None
    failed: ScriptCall | None = None
    try:
        for k, call in enumerate(calls):
            if k in done:
                continue
            # no health-check PING while a reply is in flight: it would read that reply
            await conn.send_packed_command(conn.pack_command(*evalsha(call)),
                                           check_health=not in_flight)
            in_flight.append((k, call))
            if len(in_flight) == 2:  # read the one before while Redis runs this one
                before, failed = in_flight.pop(0)
                error = await _read_async(client, conn, before, on_reply, done)
                if error is not None:
                    break
        while in_flight:
            before, call = in_flight.pop(0)
            late = await _read_async(client, conn, before, on_reply, done)
            if error is None and late is not None:
                error, failed = late, call
    except BaseException:
        if in_flight:  # replies left on the wire (or a cancelled task): out of step
            await conn.disconnect()
        raise
    return error, failed if error is not None else None


async def _read_async(client: Any, conn: Any, k: int, on_reply: Callable[[int, Any], T],
                      done: dict[int, T]) -> Exception | None:
    try:
        reply = await client.parse_response(conn, "EVALSHA")
    except ResponseError as error:
        return error
    done[k] = on_reply(k, reply)
    return None
