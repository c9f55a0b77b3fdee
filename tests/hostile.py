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


@task("hostile.escape")
def escape(marker: str, then: str = "return"):
    """Leave a process behind: fork, `setsid`, fork again, and exec a long sleep named
    `marker`; then return, sleep past the time limit ("hang"), crash, or SIGKILL its
    parent, the fork server ("kill its fork server")."""
    import time

    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", [marker, "3600"])
        os._exit(0)
    time.sleep(0.2)
    if then == "hang":
        time.sleep(3600)
    if then == "crash":
        os.abort()
    if then == "kill its fork server":  # its parent: the supervisor's, or another's
        import signal

        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(3600)
    return "left one behind"


@task("hostile.hog_outside")
def hog_outside(mib: int, marker: str):
    """Hold `mib` MiB in a double-forked, `setsid` grandchild; return at once."""
    import time

    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            block = bytearray(mib << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            import setproctitle

            setproctitle.setproctitle(marker)
            time.sleep(3600)
        os._exit(0)
    time.sleep(3)
    return "held memory elsewhere"


@task("hostile.hog_shared")
def hog_shared(mib: int, where: str = "memfd", escape: bool = False):
    """Write `mib` MiB to a memfd (`where` "memfd") or to a file in /dev/shm ("shm",
    unlinked at once), never mapping it, and hold it open 3 s — in a double-forked,
    `setsid` grandchild if `escape` — then return."""
    import time

    def hold() -> None:
        if where == "memfd":
            fd = os.memfd_create("hog")
        else:
            path = f"/dev/shm/forq-hog-{os.getpid()}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.unlink(path)
        chunk = b"x" * (1 << 20)
        for _ in range(mib):
            os.write(fd, chunk)

    if not escape:
        hold()
    elif os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            hold()
            time.sleep(3600)
        os._exit(0)
    time.sleep(3)
    return "held shared memory"


@task("hostile.leave_tree")
def leave_tree(marker: str, how: str = "subreaper"):
    """Take a process out of the job's child's tree while the job runs — clear the
    child's subreaper flag and double-fork ("subreaper"), or `clone(CLONE_PARENT)`, a
    sibling of the child ("clone_parent") — as an exec'd sleep named `marker`; then
    say how long it lived, up to 3 s, while the job ran."""
    import ctypes
    import select
    import time

    libc = ctypes.CDLL(None, use_errno=True)
    read_fd, write_fd = os.pipe()
    if how == "subreaper":
        libc.prctl(36, 0, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER off
        if os.fork() == 0:
            os.setsid()
            pid = os.fork()
            if pid == 0:
                os.execv("/bin/sleep", [marker, "3600"])
            os.write(write_fd, str(pid).encode())
            os._exit(0)
    else:  # x86_64: clone(flags, newsp = 0: this stack, copied) is a fork
        pid = libc.syscall(56, 0x00008000 | 17, 0, 0, 0, 0)  # CLONE_PARENT | SIGCHLD
        if pid == 0:
            os.execv("/bin/sleep", [marker, "3600"])
        if pid < 0:
            return {"error": os.strerror(ctypes.get_errno())}
        os.write(write_fd, str(pid).encode())
    escapee = int(os.read(read_fd, 64))
    started = time.monotonic()
    try:
        pidfd = os.pidfd_open(escapee)
    except ProcessLookupError:
        return {"lived": 0.0}
    ended = select.select([pidfd], [], [], 3)[0]
    return {"lived": round(time.monotonic() - started, 3) if ended else None}


@task("hostile.many_files")
def many_files(n: int):
    """Hold `n` open files for 3 s (RLIMIT_NOFILE raised for them), then return."""
    import resource
    import time

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 64), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(n)]
    time.sleep(3)
    return len(held)


@task("hostile.read_file")
def read_file(path: str):
    """What this job reads at `path` (the supervisor's config, its password file)."""
    try:
        with open(path) as f:
            return {"read": f.read()}
    except OSError as exc:
        return {"error": exc.strerror}


@task("hostile.fork_bomb")
def fork_bomb(n: int):
    """Start `n` processes that sleep; return how many could be started."""
    import time

    started = 0
    for _ in range(n):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        started += 1
    time.sleep(1)  # long enough to be sampled
    return started


@task("hostile.prowl")
def prowl(supervisor_pid: int):
    """Look for other jobs and the supervisor, and try to harm them: what it found and
    what worked."""
    import signal

    me = os.getpid()
    found = {"jobs": [], "killed": [], "supervisor": {}}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if cmdline.startswith(b"forq: job"):
            found["jobs"].append(cmdline.decode(errors="replace"))
            if not _descends(int(name), supervisor_pid):
                continue  # the harm is shown on a sibling: another run's jobs on the host live
            try:
                os.kill(int(name), signal.SIGKILL)
                found["killed"].append(int(name))
            except OSError:
                pass
    sup = found["supervisor"]
    sup["in /proc"] = os.path.exists(f"/proc/{supervisor_pid}/cmdline")
    for what, attempt in (("signal", lambda: os.kill(supervisor_pid, 0)),
                          ("pidfd", lambda: os.close(os.pidfd_open(supervisor_pid))),
                          ("environ", lambda: open(f"/proc/{supervisor_pid}/environ").close()),
                          ("mem", lambda: open(f"/proc/{supervisor_pid}/mem", "rb").close())):
        try:
            attempt()
            sup[what] = True
        except OSError:
            sup[what] = False
    return found


def _descends(pid: int, ancestor: int) -> bool:
    """Whether `ancestor` is among `pid`'s parents (as far as this process can see)."""
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


@task("hostile.dial")
def dial(port: int):
    """Reach 127.0.0.1:`port` (Redis, outside), and a listener of its own on loopback."""
    import socket

    out = {}
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        out["outside"] = True
    except OSError:
        out["outside"] = False
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=2).close()
        out["loopback"] = True
    out["interfaces"] = sorted(name for _, name in socket.if_nameindex())
    return out


@task("hostile.fill_tmp")
def fill_tmp(marker: str, size: int):
    """Leave `marker` in /tmp and try to write `size` bytes there."""
    with open(f"/tmp/{marker}", "w") as f:
        f.write("left behind")
    try:
        with open(f"/tmp/{marker}.big", "wb") as f:
            chunk = b"x" * (1 << 20)
            for _ in range(size >> 20):
                f.write(chunk)
        return "wrote it all"
    except OSError as exc:
        return f"refused: {exc.strerror}"


@task("hostile.shout")
def shout(lines: int, size: int = 0, truncate: bool = False):
    """Print `lines` numbered lines, then `size` bytes more to stdout (a flood);
    `truncate`: first try to empty whatever file stdout is."""
    import sys

    if truncate:
        try:
            os.ftruncate(1, 0)
        except OSError as exc:
            print(f"ftruncate refused: {exc.strerror}")
    for i in range(lines):
        print(f"line {i} \x1b[31mred\x1b[0m")
    sys.stdout.flush()
    chunk = b"y" * 65536 + b"\n"
    while size > 0:
        size -= os.write(1, chunk[:size])
    print("the end", file=sys.stderr)
    return "shouted"


@task("hostile.whoami")
def whoami(hold: float = 0.0):
    """What a job is, seen from inside: its pid, its capabilities, the processes it
    sees. Holds `hold` seconds first (to be looked at from outside)."""
    import time

    time.sleep(hold)
    with open("/proc/self/status") as f:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    return {"pid": os.getpid(), "cap_eff": status.get("CapEff", "").strip(),
            "cap_bnd": status.get("CapBnd", "").strip(),
            "sees": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}


@task("hostile.proc_self")
def proc_self():
    """/proc/<os.getpid()> is this process (what psutil.Process() reads)."""
    with open(f"/proc/{os.getpid()}/stat") as f:
        return f.read().split()[0] == str(os.getpid()) and os.path.samefile(
            f"/proc/{os.getpid()}", "/proc/self")
