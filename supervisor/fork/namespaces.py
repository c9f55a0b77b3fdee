"""A job in namespaces of its own (`[sandbox].namespaces = true`).

The job's child C (forked by the fork server, watched by the supervisor) unshares new
PID, mount and IPC namespaces (and a network namespace for `network = "none"`), then
forks G, which is PID 1 of the new PID namespace and runs the handler; C waits for G and
ends the way G ended (same exit code, same signal). Why this shape:

* Every process the job starts is in G's PID namespace, whatever it does (double fork,
  `setsid`): when G ends, or C is killed (G dies with it, PR_SET_PDEATHSIG), the kernel
  kills them all. Orphans are re-parented to G, so they stay in the tree whose memory
  the supervisor samples. A PID namespace rather than a child subreaper in the fork
  server: a subreaper adopts the orphans of every job, and cannot tell whose they are.
* A job sees only its own processes (a fresh /proc) and cannot name any other process
  to signal, ptrace or `pidfd_getfd` it: not the supervisor, not another job.
* Unprivileged (a `run_as` fork server, or a service user), C first unshares a user
  namespace mapping only its own uid and gid; there RLIMIT_NPROC counts the processes
  of that namespace alone, which makes it a per-job `max_processes`. Before the
  handler runs, G drops every capability and sets no_new_privs, so it cannot unmount
  its /proc or /tmp to see what is under them.

C cannot be G: unshare(CLONE_NEWPID) moves only the caller's future children.
PID 1 ignores signals it has no handler for, even SIGTERM from the supervisor: G
installs one that ends it as SIGTERM would (a handler may install its own).
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


def enter(*, network: bool, private_tmp: bool, tmp_bytes: int, max_processes: int) -> None:
    """Called in C: returns in G (PID 1 of the job's namespaces); C itself waits for G
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
    # our mounts must not reach the host's mount namespace
    _mount("none", "/", "", MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if private_tmp:
        for path in ("/tmp", "/dev/shm"):
            if os.path.isdir(path):
                _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV,
                       f"size={tmp_bytes},mode=1777")
    if network:
        _loopback_up()
    if user:
        if max_processes:
            import resource

            resource.setrlimit(resource.RLIMIT_NPROC, (max_processes, max_processes))
        _drop_capabilities()


def _end_as_sigterm(_signum: int, _frame: object) -> None:
    os._exit(128 + signal.SIGTERM)


def _wait_and_mirror(pid: int) -> None:
    """C's life after the fork: ignore what is meant for G, wait, end as G ended."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    os.closerange(3, 4)  # the result pipe is G's
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


def _drop_capabilities() -> None:
    """No capability left, none to regain (no_new_privs; an empty bounding set)."""
    _call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for cap in range(64):
        if _LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _call("capset", ctypes.byref(header), ctypes.byref(data))
