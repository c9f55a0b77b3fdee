"""Hostile handlers: each does to forq what an attacker's job would (tests/test_hostile.py)."""

from __future__ import annotations

import base64
import os

from forq import task


@task("hostile.pipe")
def pipe(data_b64: str, code: int = 0):
    """Write raw bytes to the result pipe (fd 3) instead of a result, then exit."""
    data = base64.b64decode(data_b64)
    view = memoryview(data)
    while view:
        view = view[os.write(3, view):]
    os._exit(code)


@task("hostile.huge_error")
def huge_error(size: int):
    """Raise an exception whose message is `size` bytes."""
    raise ValueError("x" * size)


@task("hostile.flood_pipe")
def flood_pipe(size: int):
    """Write `size` bytes to the result pipe without ever ending the line."""
    chunk = memoryview(b"x" * 65536)
    while size > 0:
        size -= os.write(3, chunk[:min(size, len(chunk))])
    os._exit(0)
