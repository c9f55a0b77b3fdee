"""`async def` handlers (and one sync handler that forgets to await), for the tests of
how a real supervisor runs them: each in its own forked child, with a fresh loop."""

from __future__ import annotations

import asyncio
import ctypes
import os

from forq import current, task


@task("tests.async.echo")
async def echo(*args: object) -> dict[str, object]:
    await asyncio.sleep(0.01)
    ctx = current()  # the job's context reaches a coroutine like any handler
    follow = ctx.enqueue("tests.async.echo", "follow-up") if args != ("follow-up",) else None
    return {"args": list(args), "job": ctx.id, "follow": follow}


@task("tests.async.fail")
async def fail(message: str) -> None:
    await asyncio.sleep(0)
    raise ValueError(message)


@task("tests.async.sleep")
async def sleep(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@task("tests.async.hog")
async def hog(megabytes: int) -> int:
    blocks = []
    for _ in range(megabytes // 4):
        blocks.append(bytearray(os.urandom(1)) * (4 << 20))
        await asyncio.sleep(0.005)  # between samples: the limit is enforced mid-await
    return len(blocks)


@task("tests.async.segfault")
async def segfault() -> None:
    await asyncio.sleep(0)
    ctypes.string_at(0)


@task("tests.async.forgot")
def forgot_async() -> object:
    """A plain function returning a coroutine: the mistake the error message names."""
    return sleep(0)
