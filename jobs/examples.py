"""Example handlers: the demo's jobs, and a reference for writing your own.

The supervisor preloads this module (``imports = ["forq.examples"]``), so each
forked child finds these handlers already imported.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import time

from forq import current, task


@task("examples.add")
def add(a: float, b: float) -> float:
    """A quick job."""
    return a + b


@task("examples.hash")
def hash_rounds(rounds: int = 200_000) -> str:
    """A CPU-heavy job: the child runs niced, so the supervisor's lease keeping
    stays on time however many of these run at once."""
    digest = b"forq"
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


@task("examples.burn")
def burn(seconds: float) -> int:
    """Burn CPU for `seconds` of wall time; returns the loop count."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


@task("examples.flaky")
def flaky(succeed_on: int = 3) -> str:
    """Fails until its `succeed_on`-th attempt: shows retries with backoff."""
    attempt = current().attempts + 1
    if attempt < succeed_on:
        raise RuntimeError(f"flaky: attempt {attempt} of {succeed_on} fails on purpose")
    return f"succeeded on attempt {attempt}"


@task("examples.hog")
def hog(megabytes: int = 512, step: int = 16, in_grandchild: bool = False) -> int:
    """Allocates memory step by step (touching every page) past its limit: the
    supervisor sees the RSS of the whole process tree and kills it."""
    if in_grandchild:
        pid = os.fork()
        if pid == 0:
            _allocate(megabytes, step)
            os._exit(0)
        os.waitpid(pid, 0)
        return 0
    return _allocate(megabytes, step)


def _allocate(megabytes: int, step: int) -> int:
    blocks = []
    for _ in range(0, megabytes, step):
        blocks.append(bytearray(os.urandom(1)) * (step << 20))
        time.sleep(0.01)
    return len(blocks)


@task("examples.sleep")
def sleep(seconds: float) -> float:
    """Sleeps: exceeds a short time limit, or stands for a long job in a drain."""
    time.sleep(seconds)
    return seconds


@task("examples.segfault")
def segfault() -> None:
    """Crashes its process with SIGSEGV every time: a poison job. Each crash is
    reclaimed; after max_crashes it is dead, not retried forever."""
    ctypes.string_at(0)


@task("examples.exit")
def exit_now(code: int = 3) -> None:
    """Leaves without a result (os._exit): reported as a crash, not a failure."""
    os._exit(code)


@task("examples.report")
def report() -> dict[str, float]:
    """The example schedule's job."""
    return {"generated_at": time.time()}


@task("images.resize")
def resize(path: str, width: int = 128) -> dict[str, object]:
    """Stands for a real image job; its limits come from [tasks."images.resize"]."""
    return {"path": path, "width": width}


@task("examples.vote", idempotent=True)
def vote(item: str, user: str) -> str:
    """Records a vote, then asks for the listing to be recalculated: the follow-up is
    enqueued atomically with this job's ack, so it is never lost."""
    current().enqueue("examples.recount", item)
    return f"{user} voted for {item}"


@task("examples.recount")
def recount(item: str) -> str:
    return f"recounted {item}"
