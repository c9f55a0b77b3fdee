"""Handlers used only by tests (preloaded by test supervisors beside forq.examples)."""

from __future__ import annotations

import os
import random
import socket
import time

from forq import NonRetryable, current, task


@task("tests.echo")
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task("tests.fail")
def fail(message: str = "boom"):
    raise ValueError(message)


@task("tests.fatal")
def fatal():
    raise NonRetryable("cannot ever work")


@task("tests.random_draw")
def random_draw() -> float:
    """The fork server imported `random` (so its generator's state is the fork server's
    until the child reseeds it)."""
    return random.random()


@task("tests.open_fds")
def open_fds():
    """Which file descriptors the child holds, and whether any is a socket."""
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    sockets = []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            sockets.append(fd)
    return {"fds": fds, "sockets": sockets, "title": open("/proc/self/cmdline").read(),
            "pgid": os.getpgid(0), "pid": os.getpid(), "sid": os.getsid(0),
            "nice": os.nice(0), "env_notify": os.environ.get("NOTIFY_SOCKET")}


@task("tests.touch")
def touch(path: str, sleep: float = 0.0):
    """Append one line per execution to `path` (outside Redis), then maybe sleep."""
    with open(path, "a") as f:
        f.write(f"{current().id} {os.getpid()} start\n")
    time.sleep(sleep)
    with open(path, "a") as f:
        f.write(f"{current().id} {os.getpid()} end\n")
    return os.getpid()


@task("tests.big_result")
def big_result(n: int):
    return "x" * n


@task("tests.connect")
def connect(host: str, port: int):
    with socket.create_connection((host, port), timeout=2):
        return True


@task("tests.fanout")
def fanout(path: str, other: str, sleep: float = 0.0):
    """Record this execution, then ask for two follow-ups: `tests.touch` on queue `other`
    (id `<this id>-1`) and `tests.touch` on this job's own queue (id `<this id>-2`);
    return `sleep` seconds later."""
    with open(path, "a") as f:
        f.write(f"{current().id} {os.getpid()} start\n")
    there = current().enqueue("tests.touch", path, queue=other)
    here = current().enqueue("tests.touch", path)
    time.sleep(sleep)
    return {"there": there, "here": here}


@task("tests.whoami")
def whoami():
    """What the sandbox left a handler: its user, environment and limits."""
    import resource

    return {"uid": os.getuid(), "gid": os.getgid(), "env": sorted(os.environ),
            "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            "core": resource.getrlimit(resource.RLIMIT_CORE)[0],
            "as": resource.getrlimit(resource.RLIMIT_AS)[0],
            "oom_score_adj": int(open("/proc/self/oom_score_adj").read())}


@task("tests.lineage")
def lineage(sleep: float = 0.0, ballast: str = ""):
    """Who forked this child, and what it inherited: redis is not among its modules when
    a lean fork server forked it. `ballast` is ignored: it makes the job as large as a
    test needs."""
    import sys

    time.sleep(sleep)
    return {"pid": os.getpid(), "ppid": os.getppid(), "redis": "redis" in sys.modules,
            "nice": os.nice(0)}


@task("tests.cgroup")
def cgroup():
    """The child's cgroup v2 directory and the memory limit set on it."""
    path = "/sys/fs/cgroup" + open("/proc/self/cgroup").read().strip().split("::", 1)[1]
    return {"cgroup": path, "memory_max": open(f"{path}/memory.max").read().strip()}


@task("tests.escape")
def escape():
    """Leaves a process behind in a session of its own, out of the job's process group:
    only the job's cgroup still holds it. Returns its pid."""
    import subprocess

    proc = subprocess.Popen(["sleep", "600"], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return proc.pid


@task("tests.wait_file")
def wait_file(path: str, timeout: float = 30.0):
    """Run until `path` exists (the test decides when the job ends), at most `timeout` s."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.01)
    return path


@task("tests.gated")
def gated(log: str, gate: str, timeout: float = 30.0):
    """Append "ID start" to `log`, run until `gate` exists, append "ID end": the test sees
    which jobs ran at the same time, and decides when each ends."""
    with open(log, "a") as f:
        f.write(f"{current().id} start\n")
    deadline = time.monotonic() + timeout
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(log, "a") as f:
        f.write(f"{current().id} end\n")


# -- the circuit breaker's (tests/test_breaker.py) ---------------------------------------


@task("tests.segv")
def segv(n: int = 0):
    """A bad deploy: every job of this task crashes its process with SIGSEGV."""
    import signal

    os.kill(os.getpid(), signal.SIGSEGV)


@task("tests.sometimes")
def sometimes(n: int):
    """Fails 1 job in 20 (5%), always the same way: a normal error rate."""
    if n % 20 == 0:
        raise ValueError(f"job {n} fails")
    return n


@task("tests.liar")
def liar(name: str, size: int = 1):
    """A hostile handler: raises an exception whose type name it chose (another task's
    name, a signal's, `size` times over): its own task's pattern, capped, nothing else."""
    raise type(name * size, (Exception,), {})("not what it says")


@task("tests.hold_memory")
def hold_memory(mib: int, seconds: float) -> int:
    """Touches `mib` MiB at once, holds it for `seconds`, then returns: over its memory
    limit only for that long, so only a sampler that looks within it kills the job."""
    block = bytearray(os.urandom(1)) * (mib << 20)
    time.sleep(seconds)
    return len(block)
