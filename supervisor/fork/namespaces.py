"""A job in namespaces of its own (`[sandbox].namespaces = true`).

The job's child C is PID 1 of a new PID namespace: the fork server unshares a PID
namespace just before it forks C, and sets its own back right after
(`fork_as_init`). C then unshares new mount and IPC namespaces (and a network
namespace for `network = "none"`) and runs the handler (`enter_as_init`). Why:

* Every process the job starts is in C's PID namespace, whatever it does (double fork,
  `setsid`, `clone(CLONE_PARENT)`): when C ends, or is killed, or its fork server dies
  (C dies with it, PR_SET_PDEATHSIG), the kernel kills them all. Orphans are re-parented
  to C, so they stay in the tree whose memory the supervisor samples. (Without
  namespaces, subreapers do most of that: `orphans`.)
* A job sees only its own processes (a fresh /proc) and cannot name any other process
  to signal, ptrace or `pidfd_getfd` it: not the supervisor, not another job.
* Unprivileged (a `run_as` fork server, or a service user), the fork server first
  makes a user namespace of its own, mapping only its own uid and gid, and a PID
  namespace in which it is PID 1 (`become_init`): there it holds the privilege to make
  and leave a PID namespace per job. Each C then unshares one more user namespace,
  mapping its uid alone, in which RLIMIT_NPROC counts the processes of that job alone:
  a per-job `max_processes`. Before the handler runs, C drops every capability and sets
  no_new_privs, so it cannot unmount its /proc or /tmp to see what is under them.
* PID 1 ignores signals it has no handler for, even SIGTERM from the supervisor: C
  installs one that ends it as SIGTERM would (a handler may install its own).

Why C is PID 1 rather than the parent of one: C could only unshare a PID namespace for
its own future children, and a second fork of a Python process per job, with C waiting
for it, cost more than everything else the sandbox does (bench/sandbox.py). That shape
(`enter`) is kept for a child that is not PID 1 of its own namespace: a child exec'd
alone (`fork_server = false`), or a fork server that may not make PID namespaces.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import signal
import socket
import struct
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_BIND = 0x1000
MS_REC, MS_PRIVATE = 0x4000, 1 << 18

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24

SIOCSIFFLAGS = 0x8914
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40

_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class NamespaceError(OSError):
    """A namespace could not be set up (the message says which step)."""


def _libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()  # resolved in the fork server, before any fork


def _call(name: str, *args: Any) -> None:
    if _LIBC is None or _LIBC[name](*args) != 0:
        err = ctypes.get_errno() if _LIBC is not None else errno.ENOSYS
        raise NamespaceError(err, f"{name}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _mount(source: str, target: str, fstype: str, flags: int, data: str = "") -> None:
    _call("mount", source.encode(), target.encode(), fstype.encode() if fstype else None,
          ctypes.c_ulong(flags), data.encode() if data else None)


_base_pid_ns = -1  # the fork server's own PID namespace, to go back to after each fork
_own_user_ns = False  # the fork server made a user namespace of its own (`become_init`)


def _own_pid_namespace() -> int:
    global _base_pid_ns
    if _base_pid_ns < 0:
        _base_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    return _base_pid_ns


def fork_as_init() -> int:
    """`os.fork()`, the child PID 1 of a new PID namespace. Raises NamespaceError, with
    nothing changed, if this process may not make one."""
    base = _own_pid_namespace()
    _call("unshare", CLONE_NEWPID)  # for our next child only: we stay where we are
    try:
        pid = os.fork()
    except BaseException:
        _back_to(base)
        raise
    if pid:
        _back_to(base)
    return pid


def _back_to(base: int) -> None:
    """Our next children in our own PID namespace again. If the kernel refused, every
    later child would be forked into the last job's namespace: end at once instead (the
    supervisor starts a new fork server)."""
    if _LIBC is None or _LIBC.setns(base, CLONE_NEWPID) != 0:
        os._exit(75)


def become_init(close_in_parent: int, hide: tuple[str, ...] = ()) -> list[str]:
    """For an unprivileged fork server: go on in a user namespace of our own (our uid
    and gid mapped to themselves) as PID 1 of a PID namespace of our own, where we may
    make and leave a PID namespace per job (`fork_as_init`). The process we were stays
    behind, waits, and ends as we do (the supervisor watches it); `close_in_parent` is
    its copy of our socket to the supervisor, which it must not keep open. In the mount
    namespace we make there, the files of `hide` (the config, the password file) are
    /dev/null for us and for every job: returns those hidden. Raises NamespaceError
    (nothing changed) where user namespaces are not allowed."""
    global _own_user_ns
    uid, gid = os.getuid(), os.getgid()
    _call("prctl", PR_SET_DUMPABLE, 1, 0, 0, 0)  # else our uid_map is root's to write
    try:
        _call("unshare", CLONE_NEWUSER | CLONE_NEWPID)
        _own_user_ns = True
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    finally:
        # not ptraceable or readable by our jobs, which run as the same user
        _call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(alive_r)
        os.close(close_in_parent)
        _wait_and_mirror(pid)
    os.close(alive_w)
    _call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([alive_r], [], [], 0)[0]:  # EOF: the process we were is gone
        os._exit(0)
    os.close(alive_r)
    # a /proc of our PID namespace, for us and for the jobs forked without namespaces
    # of their own: their pids are ours, and /proc/PID must name the same process
    try:
        _call("unshare", CLONE_NEWNS)
        _mount_own(private_tmp=False, tmp_bytes=0)
    except NamespaceError as exc:
        print(f"no /proc of its own PID namespace ({exc}): a job without namespaces of "
              f"its own reads the host's /proc, where its pid names another process",
              flush=True)
        return []
    return _hide(hide)


def _hide(paths: tuple[str, ...]) -> list[str]:
    """Bind /dev/null over each file of `paths` in our mount namespace, which every job
    inherits: read there, it is empty, whatever its mode. A job cannot take it off: it
    holds no capability, and in a user namespace of its own the mount is locked."""
    hidden = []
    for path in paths:
        try:
            if os.path.isfile(path):
                _mount("/dev/null", path, "", MS_BIND)
                hidden.append(path)
        except (NamespaceError, OSError) as exc:
            print(f"{path} is not hidden from jobs: {exc}", flush=True)
    return hidden


def holds_namespace_capabilities() -> bool:
    """True in a fork server that made its own user namespace (`become_init`): a child
    of it that gets no namespaces must drop the capabilities it holds there."""
    return _own_user_ns


def enter_as_init(*, network: bool, private_tmp: bool, tmp_bytes: int,
                  max_processes: int) -> None:
    """Called in C, PID 1 of its own PID namespace (`fork_as_init`): the rest of its
    namespaces, then no capability left. Raises NamespaceError."""
    signal.signal(signal.SIGTERM, _end_as_sigterm)
    _call("unshare", CLONE_NEWNS | CLONE_NEWIPC | (CLONE_NEWNET if network else 0))
    _mount_own(private_tmp, tmp_bytes)
    if network:
        _loopback_up()
    if os.geteuid() != 0:
        uid, gid = os.getuid(), os.getgid()
        _call("prctl", PR_SET_DUMPABLE, 1, 0, 0, 0)
        _call("unshare", CLONE_NEWUSER)  # this job's own process count (RLIMIT_NPROC)
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        _set_max_processes(max_processes)
        drop_capabilities()


def _mount_own(private_tmp: bool, tmp_bytes: int) -> None:
    # our mounts must not reach the host's mount namespace
    _mount("none", "/", "", MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if private_tmp:
        for path in ("/tmp", "/dev/shm"):
            if os.path.isdir(path):
                _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV,
                       f"size={tmp_bytes},mode=1777")


def _set_max_processes(max_processes: int) -> None:
    if max_processes:
        import resource

        resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))


def enter(*, network: bool, private_tmp: bool, tmp_bytes: int, max_processes: int) -> None:
    """The other shape, for a child C that is not PID 1 of its own namespace: C
    unshares them all and forks G, PID 1 there, which runs the handler. Returns in G (PID 1 of the job's namespaces); C itself waits for G
    and ends as G did, never returning. Raises NamespaceError before the fork."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | (CLONE_NEWNET if network else 0)
    user = os.geteuid() != 0
    if user:
        flags |= CLONE_NEWUSER
        _call("prctl", PR_SET_DUMPABLE, 1, 0, 0, 0)  # else our uid_map is root's to write
    _call("unshare", flags)
    if user:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    alive_r, alive_w = os.pipe()  # G's check that C did not die before PDEATHSIG was set
    pid = os.fork()
    if pid:
        os.close(alive_r)
        _wait_and_mirror(pid)
    os.close(alive_w)
    _call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([alive_r], [], [], 0)[0]:  # EOF: C is gone already
        os._exit(70)
    os.close(alive_r)
    signal.signal(signal.SIGTERM, _end_as_sigterm)
    _mount_own(private_tmp, tmp_bytes)
    if network:
        _loopback_up()
    if user:
        _set_max_processes(max_processes)
        drop_capabilities()


def _end_as_sigterm(_signum: int, _frame: object) -> None:
    os._exit(128 + signal.SIGTERM)


def _wait_and_mirror(pid: int) -> None:
    """The parent's life after the fork: ignore what is meant for the child, wait, end
    as it ended."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    os.closerange(3, 4)  # a job's result pipe is G's
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(70)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 70)


def _loopback_up() -> None:
    """A new network namespace has only `lo`, and down: bring it up."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = struct.pack("16sH14s", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING, b"")
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, ifreq)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """No capability left, none to regain (no_new_privs; an empty bounding set)."""
    _call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for cap in range(64):
        if _LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _call("capset", ctypes.byref(header), ctypes.byref(data))


def enter_for_job(network_none: bool, private_tmp: bool, tmp_bytes: int,
                  max_processes: int) -> bytes:
    """A job's child: returns in its namespaces with b"", or with the result message of
    why they could not be made (a failure of the job, retried)."""
    from forq.supervisor.fork.messages import ERROR_CAPS, encode

    # PID 1 already when the fork server made our PID namespace (`fork_as_init`)
    into = enter_as_init if os.getpid() == 1 else enter
    try:
        into(network=network_none, private_tmp=private_tmp, tmp_bytes=tmp_bytes,
             max_processes=max_processes)
    except OSError as exc:
        reason = f"sandbox not set up: {exc.strerror or exc}"[:ERROR_CAPS["reason"]]
        err = {"type": "SandboxError", "message": reason, "traceback": "", "reason": reason}
        return encode({"t": "result", "ok": False, "error": err, "fatal": False})
    return b""
