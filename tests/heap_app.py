"""A handler module with an application's heap: 32 MiB of small objects built at import
(what the fork server's huge pages are for, `supervisor/fork/hugepages.py`)."""

from __future__ import annotations

from forq import task

HEAP = [(f"item {i}", i, {"n": i}) for i in range(32 * 2 ** 20 // 400)]


@task("tests.heap_env")
def heap_env() -> dict:
    """What a job of this module sees: its heap, and the glibc tunables of its process."""
    import os

    return {"items": len(HEAP), "tunables": os.environ.get("GLIBC_TUNABLES")}
