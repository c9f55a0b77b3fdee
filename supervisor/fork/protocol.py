"""The fork server's wire protocol, shared by both ends (`client` and `server`).

One SOCK_SEQPACKET socketpair; every message is one JSON datagram, file descriptors
travel beside it (SCM_RIGHTS):

* supervisor → server: {"title": ..., "spec": {...ChildSpec...}} with the child's end
  of its channel (a socketpair, `messages.channel`) and the write end of the output
  pipe (the child's stdout and stderr) attached; a spec too big for one datagram
  travels in a memfd attached third, and the message says {"title": ..., "memfd":
  true}. The request may carry "fence_at": the child's first fencing deadline (below).
* supervisor → server: {"fence": [[pid, fence_at], ...]} after each confirmed lease
  extension: each child's new fencing deadline. Unknown pids are ignored.
* supervisor → server: {"retire": true} when it will ask for no more children (a
  reload replaced this server): the server lets its spares go, and stays until its
  running children have ended.
* server → supervisor: {"ready": pid, "tasks": {name: {"idempotent": bool, "chunk":
  int (chunked tasks only)}}, "code":
  fingerprint} once, after start-up (`fingerprint`: the handler code it imported), or {"fatal": text, "module": name} if it cannot start; {"pid": pid}
  with the child's pidfd attached (opened before the server could reap it; the
  supervisor takes the pid from the pidfd: a fork server that made a PID namespace of
  its own, `namespaces.become_init`, names its children by their pids in that
  namespace, and every pid in its messages, "pid", "exit" and "fence" alike, is that
  name, `RunningChild.server_pid`); {"error": text} if the fork failed;
  {"exit": pid, "status": wait status, "maxrss": KiB, "utime_us", "stime_us": its
  CPU time (wait4's rusage: its tree's, as it reaped them)} when it has SIGKILLed the
  child's process group and reaped it, with "fenced": true if it killed the child for
  its fencing deadline. The fork server runs handler modules' top-level code: the
  supervisor checks all of this as untrusted input (`client`).
* server → spare (an idle child it forked in advance, `server.py`), on a
  SOCK_SEQPACKET socketpair of that spare's own: the supervisor's request as it came,
  once checked, with its first two fds; EOF means the spare is not needed. The
  supervisor never sees this hop: a spare's pid reaches it in {"pid": pid} like any
  child's.

Fencing deadlines are CLOCK_MONOTONIC seconds (`time.monotonic()`, one clock for every
process on the machine): the moment until which the supervisor can prove the child's
lease, less a margin, so before any other supervisor can reclaim the job. The
supervisor kills such a child itself; the fork server does it too, because a supervisor
that is frozen (SIGSTOP, a VM pause, a swap storm) cannot, and the job would then run
twice at once. A frozen fork server cannot either: it is a small process that only
forks and reaps. A fork server that was starved itself reads the deadlines waiting in
its socket before it judges one passed: its supervisor may have proven the lease meanwhile.
"""

from __future__ import annotations

import array
import json
import os
import socket
from dataclasses import dataclass
from typing import Any

RECV_MAX = 1 << 16  # a request above this comes in a memfd


def fds_of(ancillary: list) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


def encode(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    send_encoded(sock, encode(message), fds)


def send_encoded(sock: socket.socket, data: bytes, fds: list[int] | None = None) -> None:
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.send(data)


def exit_report(pid: int, status: int, usage: Any) -> dict[str, Any]:
    """The exit report of a reaped child, from `os.wait4`'s status and rusage: its CPU
    time counts every process of its tree it reaped (a job's child is a subreaper)."""
    return {"exit": pid, "status": status, "maxrss": usage.ru_maxrss,
            "utime_us": int(usage.ru_utime * 1e6), "stime_us": int(usage.ru_stime * 1e6)}


def read_memfd(fd: int) -> bytes:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# -- the task table of its first message ----------------------------------------------
# The supervisor never imports handler modules (their top-level code is handler code);
# the fork server does, and tells the supervisor which task names exist and with which
# registration options, in its first message. Module top-level code may have tampered
# with that process, so the table is read as untrusted input: checked, capped, and a
# malformed one is refused whole.

MAX_TASKS = 10_000
MAX_NAME = 300


@dataclass(frozen=True)
class TaskInfo:
    name: str
    idempotent: bool = False
    chunk: int = 1  # `task(chunk=N)`: up to N of its jobs in one child


class BadTaskTable(ValueError):
    """The fork server's task table is not what `describe` builds."""


MAX_CHUNK = 32  # `forq.registry.MAX_CHUNK`: what a table may say


def describe(registered: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The table the fork server sends (from `forq.registry.registered()`); "chunk"
    only for a chunked task (a table without chunks reads as it did before)."""
    table: dict[str, dict[str, Any]] = {}
    for name, spec in registered.items():
        table[name] = {"idempotent": bool(spec.idempotent)}
        if getattr(spec, "chunk", 1) > 1:
            table[name]["chunk"] = int(spec.chunk)
    return table


def parse(raw: object) -> dict[str, TaskInfo]:
    """The supervisor's reading of a table from `describe`."""
    if not isinstance(raw, dict):
        raise BadTaskTable(f"tasks must be an object, got {type(raw).__name__}")
    if len(raw) > MAX_TASKS:
        raise BadTaskTable(f"{len(raw)} tasks, over the limit of {MAX_TASKS}")
    table = {}
    for name, options in raw.items():
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise BadTaskTable(f"a task name must be 1 to {MAX_NAME} characters: {name!r:.80}")
        if not isinstance(options, dict) or set(options) - {"idempotent", "chunk"}:
            raise BadTaskTable(f"task {name!r:.80}: options must be {{\"idempotent\": bool, "
                               f"\"chunk\": int}}")
        idempotent = options.get("idempotent", False)
        if not isinstance(idempotent, bool):
            raise BadTaskTable(f"task {name!r:.80}: idempotent must be true or false")
        chunk = options.get("chunk", 1)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
            raise BadTaskTable(f"task {name!r:.80}: chunk must be an integer from 1 to "
                               f"{MAX_CHUNK}")
        table[name] = TaskInfo(name, idempotent, chunk)
    return table
