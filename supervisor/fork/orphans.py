"""Every process a job starts ends with the job, without namespaces or cgroups.

A job may leave a process behind: fork, `setsid`, fork again and let the middle process
exit. Outside a PID namespace (`namespaces`) or a cgroup of its own (`isolation.cgroups`),
nothing the kernel does ends that orphan with the job: it is re-parented to the nearest
ancestor that is a *child subreaper* (PR_SET_CHILD_SUBREAPER), or to init. So:

* Each job's child is a subreaper (`child.detach`): the orphans of its descendants become
  its own children, stay in its process tree, and count in the memory the supervisor
  samples from that tree (`isolation.memory`).
* The fork server is a subreaper too. When a job's child ends — it returned, failed, was
  killed at its time or memory limit, crashed, was cancelled or fenced — whatever was
  left of its tree becomes the fork server's, which SIGKILLs every child of its own that
  it did not fork (`Server.kill_strays`), before it reports the job's end. A child's pid
  is the fork server's until it reaps it, so no other process can be hit through a
  reused pid (what killing a job's tree by walking /proc could not promise). It looks
  when a job's child ends, when a stray ends (the stray's own orphans are next), and
  every `STRAY_SCAN` while jobs run: handler code can take a process out of its child's
  tree while the job runs (by clearing the child's subreaper flag, or with
  `clone(CLONE_PARENT)`), and such a process lives that long at most.
* When its supervisor dies (SIGKILL included) the fork server's death signal
  (PR_SET_PDEATHSIG) is `DEATH_SIGNAL`, which it catches, not SIGKILL: it kills every
  child and every orphan they leave until it has no child left (`end_every_child`), then
  exits. With SIGKILL, the job children would still die (their own PR_SET_PDEATHSIG) but
  the orphans they left would go to init and live on.

A fork server that is PID 1 of a PID namespace of its own (`namespaces.become_init`)
keeps SIGKILL: when it dies, the kernel kills every process of that namespace.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import NoReturn

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
# caught by the fork server, which ends every job's processes before it exits: a
# real-time signal, which nothing sends to a process group by habit (as terminals and
# service managers do SIGINT, SIGTERM or SIGHUP)
DEATH_SIGNAL = signal.SIGRTMIN + 1
# how often a fork server with jobs running looks for processes that left a job's tree
STRAY_SCAN = 0.05
# the longest a fork server takes to end its children's processes once its supervisor
# is gone (a process in uninterruptible sleep cannot be waited for for ever)
END_WITHIN = 5
_HAS_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def become_subreaper(prctl: object) -> bool:
    """Make this process a child subreaper (`prctl`: libc's, or None); False if not."""
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0  # type: ignore[operator]


def end_with_supervisor(supervisor_pid: int, prctl: object) -> None:
    """(The fork server's.) From now on, when the supervisor dies, end every job's
    processes, then exit (`end_every_child`), rather than die at once by SIGKILL and
    leave their orphans to init. As PID 1 of a PID namespace of our own
    (`namespaces.become_init`), SIGKILL it stays: our end is the end of every process in
    that namespace. `prctl`: libc's, or None (nothing to do)."""
    if prctl is None or os.getpid() == 1:
        return
    signal.signal(DEATH_SIGNAL, lambda *_: end_every_child())
    prctl(PR_SET_PDEATHSIG, DEATH_SIGNAL, 0, 0, 0)  # type: ignore[operator]
    if os.getppid() != supervisor_pid:  # it died before we asked
        end_every_child()


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        while len(chunks[-1]) == 65536:  # a long list: read on
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        os.close(fd)


def own_children() -> list[int]:
    """The pids of this process's children (every thread's): those it forked and those
    it adopted. Raises OSError if /proc cannot tell."""
    me = os.getpid()
    if not _HAS_CHILDREN_FILE:
        return _children_by_scan(me)
    # one thread (a fork server's usual): its file alone, without listing /proc/me/task
    tids = ([me] if os.stat(f"/proc/{me}/task").st_nlink == 3
            else os.listdir(f"/proc/{me}/task"))
    return [int(pid) for tid in tids
            for pid in _read(f"/proc/{me}/task/{tid}/children").split()]


def _children_by_scan(me: int) -> list[int]:
    """Without the kernel's children files (CONFIG_PROC_CHILDREN): every process whose
    parent is `me`, by a scan of /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ppid = int(_read(f"/proc/{name}/stat").rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == me:
            found.append(int(name))
    return found


def end_every_child() -> NoReturn:
    """SIGKILL every child, and every orphan they leave to us, until none is left; then
    exit. Each killed child that ends hands us its own children (we are a subreaper, or
    PID 1): they are killed on the next turn."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(END_WITHIN)  # never outlive the supervisor by more, whatever happens
    killed: set[int] = set()
    while True:
        try:
            children = own_children()
        except OSError:
            children = []
        for pid in children:
            if pid not in killed:
                try:
                    os.kill(pid, signal.SIGKILL)  # ours until reaped: never another's
                except ProcessLookupError:
                    pass
                killed.add(pid)
        try:
            pid, _ = os.waitpid(-1, 0)  # one of them ended: its children are ours now
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        killed.discard(pid)
        while True:  # and every other one that ended meanwhile
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if not pid:
                break
            killed.discard(pid)
    os._exit(0)


def kill_strays(keep: Callable[[int], bool]) -> None:
    """SIGKILL each child of this process that `keep` does not claim: what a job left
    behind (the fork server's). A child's pid is ours until we reap it, so the signal
    cannot reach another process through a reused pid. Children that cannot be listed
    are said, never taken as "none": the caller looks again on its next turn."""
    try:
        children = own_children()
    except OSError as exc:
        print(f"fork server: cannot list its children to end what jobs left: {exc}",
              flush=True)
        return
    for pid in children:
        if keep(pid):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
