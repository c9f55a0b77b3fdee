"""Privileges and namespaces of the fork server and of each job's child.

`drop_to` is called by the fork server before it imports any handler module, so that
module top-level code never runs with the supervisor's user. A process that changed
its uid is not dumpable: jobs running as the same user can neither ptrace the fork
server nor read its memory through /proc.
"""

from __future__ import annotations

import os
import pwd
import resource


def prepare() -> None:
    """Import now what a child needs later: after `drop_to` the interpreter's own
    files may be unreadable (a Python under /root, mode 0700)."""
    import traceback  # noqa: F401

    try:
        import setproctitle  # noqa: F401
    except ImportError:
        pass


def drop_to(user_name: str) -> None:
    """Become `user_name` for good (real, effective and saved ids; no supplementary
    groups). Raises OSError without the privilege, KeyError for an unknown user."""
    user = pwd.getpwnam(user_name)
    if (os.getuid(), os.geteuid()) == (user.pw_uid, user.pw_uid):
        return
    os.setgroups([])
    os.setresgid(user.pw_gid, user.pw_gid, user.pw_gid)
    os.setresuid(user.pw_uid, user.pw_uid, user.pw_uid)
    os.environ["HOME"] = user.pw_dir
    os.environ["USER"] = os.environ["LOGNAME"] = user.pw_name


def probe_namespaces(network: bool, private_tmp: bool) -> tuple[str, bool]:
    """Set up a job's namespaces once, in a throwaway child, as every job will: ("",
    by_init) if that works, else (why not, False) (said at start-up; jobs then run
    without them). `by_init`: the child could be forked as PID 1 of its own PID
    namespace (`namespaces.fork_as_init`), the cheaper way."""
    from forq.supervisor.fork import namespaces

    read_fd, write_fd = os.pipe()
    try:
        pid, by_init = namespaces.fork_as_init(), True
    except namespaces.NamespaceError:
        pid, by_init = os.fork(), False
    if pid == 0:
        os.close(read_fd)
        why = ""
        enter = namespaces.enter_as_init if by_init else namespaces.enter
        try:
            enter(network=network, private_tmp=private_tmp, tmp_bytes=1 << 20,
                  max_processes=0)
        except OSError as exc:
            why = str(exc.strerror or exc)
        os.write(write_fd, why.encode()[:500])
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        why_bytes = f.read(1000)
    _, status = os.waitpid(pid, 0)
    if not why_bytes and status != 0:
        return f"the probe ended with status {status}", False
    why = why_bytes.decode(errors="replace")
    return why, by_init and not why


class RunAsRefused(Exception):
    """The fork server cannot become `[sandbox].run_as` (said, then it exits 2)."""


def enter(settings: dict, sock_fd: int) -> tuple[str | None, bool, list[str]]:
    """The fork server's sandbox, before any handler code: drop to `run_as` (raises
    RunAsRefused, saying why), then, unprivileged, become PID 1 of namespaces of its own
    (hiding the files `hide` names from every job) and probe whether a job can have
    namespaces. Returns (the probe's problem: None without a probe, "" if none; whether
    jobs are forked as PID 1 of their own namespace; the files hidden)."""
    try:
        prepare()  # what a child needs later and a dropped user may not reach
        if settings.get("run_as"):
            drop_to(settings["run_as"])
    except (OSError, KeyError) as exc:
        raise RunAsRefused(
            f"cannot switch to [sandbox].run_as {settings['run_as']!r}: "
            f"{getattr(exc, 'strerror', None) or exc} (the supervisor runs as uid "
            f"{os.getuid()}; run_as needs root, or CAP_SETUID and CAP_SETGID)") from exc
    probe = settings.get("probe")
    hidden: list[str] = []
    if probe and os.geteuid() != 0:
        from forq.supervisor.fork import namespaces

        try:  # unprivileged: the privilege to make a PID namespace per job, in our own
            hidden = namespaces.become_init(sock_fd, tuple(settings.get("hide", ())))
        except OSError:
            pass  # no user namespaces for us: the probe says whether jobs can have any
    problem, init_forks = probe_namespaces(**probe) if probe else (None, False)
    return problem, init_forks, hidden


def preset_priority(priority: tuple[int, int]) -> None:
    """What `_limit` sets that depends on the job only through its `Priority`, done by a
    spare while it waits for a job of that priority (the fork server hands it no
    other): a third of a millisecond off the pick-up path, most of it the first write
    to oom_score_adj and the copy-on-write faults of the calls' first touches."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    set_oom_score_adj(priority[1])
    if priority[0]:
        os.nice(priority[0])


def set_oom_score_adj(value: int) -> None:
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, str(value).encode())  # the kernel's OOM killer takes jobs first
        finally:
            os.close(fd)
    except OSError:
        pass
