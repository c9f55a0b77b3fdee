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


@task("hostile.find_secrets")
def find_secrets(secret: str):
    """Look for `secret` (the Redis password) wherever a job could read it: its
    environment, the environment block it was exec'd with, its parent's, and files."""
    def holds(path: str) -> bool | None:
        try:
            with open(path, "rb") as f:
                return secret.encode() in f.read()
        except OSError:
            return None  # unreadable

    return {"os.environ": any(secret in v for v in os.environ.values()),
            "/proc/self/environ": holds("/proc/self/environ"),
            "parent environ": holds(f"/proc/{os.getppid()}/environ")}


@task("hostile.reach_redis")
def reach_redis(port: int):
    """Log in to Redis with every password this job can find; True if one works."""
    import socket

    found = {""} | set(os.environ.values())
    for path in ("/proc/self/environ", f"/proc/{os.getppid()}/environ"):
        try:
            with open(path, "rb") as f:
                found |= {v.partition(b"=")[2].decode(errors="replace")
                          for v in f.read().split(b"\0")}
        except OSError:
            pass
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for password in found:
            arg = password.encode()
            sock.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(arg), arg) if password
                         else b"PING\r\n")
            if sock.recv(4096).startswith((b"+OK", b"+PONG")):
                return True
    return False
