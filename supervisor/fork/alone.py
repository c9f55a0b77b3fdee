"""One job's child started without a fork server: a fresh interpreter exec'd by the
supervisor (`fork_server = false`, or no fork server could start). `oneshot` is that
child's side; `client.ForkServer` the way with a fork server."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

from forq.queue import Lease
from forq.supervisor.children.running import RunningChild
from forq.supervisor.fork.child import ChildSpec
from forq.supervisor.fork.environment import Launch
from forq.supervisor.fork.messages import channel


def spawn(lease: Lease, spec: ChildSpec, *, title: str, timeout: float,
          launch: Launch) -> RunningChild:
    """Start one child for `lease` without a fork server: a fresh interpreter, exec'd
    (never a fork of the supervisor, whose memory holds the Redis password and
    connection), that imports the handler modules itself after its sandbox is set up.
    The parent returns at once with its handles."""
    spec = dataclasses.replace(spec, imports=list(launch.imports))
    read_fd, write_fd = channel()  # the child's fd 3
    out_r, out_w = os.pipe()
    memfd = os.memfd_create("forq-spec", 0)
    try:
        data = memoryview(json.dumps({"spec": vars(spec), "title": title,
                                      "parent": os.getpid()}).encode())
        while data:
            data = data[os.write(memfd, data):]
        os.lseek(memfd, 0, os.SEEK_SET)
        env = dict(launch.env, FORQ_FORKSERVER=launch.settings())
        pid = os.posix_spawn(
            sys.executable, [sys.executable, "-m", "forq.supervisor.fork.oneshot"], env,
            file_actions=[(os.POSIX_SPAWN_DUP2, memfd, 0), (os.POSIX_SPAWN_DUP2, out_w, 1),
                          (os.POSIX_SPAWN_DUP2, out_w, 2), (os.POSIX_SPAWN_DUP2, write_fd, 3)])
    except BaseException:
        os.close(read_fd)
        os.close(out_r)
        raise
    finally:
        os.close(write_fd)
        os.close(out_w)
        os.close(memfd)
    for fd in (read_fd, out_r):
        os.set_blocking(fd, False)
        os.set_inheritable(fd, False)
    pidfd = os.pidfd_open(pid)
    now = time.monotonic()
    return RunningChild(lease, spec, pid, pidfd, read_fd, now, now + timeout, output=out_r)
