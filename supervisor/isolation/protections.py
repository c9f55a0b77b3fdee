"""Which protections against hostile handlers are on, which are off and why: one line
at start-up (like the memory-limit mode line), and `[sandbox].require`.

The names are those `[sandbox].require` accepts (`config.PROTECTIONS`); docs/sandbox.md's
threat table says what each one stops.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
from dataclasses import dataclass
from typing import Any

from forq.supervisor.config.load import Config
from forq.supervisor.isolation.shared_memory import readable_for

log = logging.getLogger("forq.supervisor")


@dataclass(frozen=True)
class Protection:
    name: str
    on: bool
    detail: str  # what it is when on, why not when off


def readable_by(path: str, user_name: str) -> bool:
    """Whether `user_name` (with no supplementary groups, as jobs run) may read `path`:
    search permission on every directory above it, read permission on it."""
    user = pwd.getpwnam(user_name)
    if user.pw_uid == 0:
        return True
    real = os.path.realpath(path)
    parts = real.split("/")[1:]
    for depth in range(len(parts)):
        try:
            st = os.stat("/" + "/".join(parts[:depth]))
        except OSError:
            return False
        if not _allows(st, user, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH):
            return False
    try:
        st = os.stat(real)
    except OSError:
        return False
    return _allows(st, user, stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)


def _allows(st: os.stat_result, user: pwd.struct_passwd, owner: int, group: int,
            other: int) -> bool:
    if st.st_uid == user.pw_uid:
        return bool(st.st_mode & owner)
    if st.st_gid == user.pw_gid:
        return bool(st.st_mode & group)
    return bool(st.st_mode & other)


def _private_config(config: Config, password_file: str | None,
                    hidden: tuple[str, ...]) -> Protection:
    user = config.sandbox.run_as
    if not user:
        return Protection("private_config", False, "jobs run as the supervisor's user, who reads "
                                            "the config and the password file")
    files = [p for p in (config.path, password_file) if p]
    shown = [p for p in files if os.path.realpath(p) not in hidden and readable_by(p, user)]
    if shown:
        return Protection("private_config", False, f"{', '.join(shown)} readable by {user} "
                          "(chmod o-r, another owner, or namespaces: a private mount view "
                          "hides them)")
    if any(os.path.realpath(p) in hidden for p in files):
        return Protection("private_config", True, f"config and password file empty for {user} "
                          "(a private mount view)")
    return Protection("private_config", True, f"config unreadable by {user}")


def _job_processes(config: Config, ns_on: bool, job_cgroups: bool) -> list[Protection]:
    """Whether every process a job starts ends with it and counts in its memory, and
    whether the memory-backed files it holds count too."""
    sb = config.sandbox
    if ns_on and sb.namespaces:
        how = "its PID namespace"
    elif job_cgroups:
        how = "its cgroup"
    elif config.fork_server:
        how = "its child and the fork server are subreapers that end what it leaves"
    else:
        how = ""
    out = [Protection("job_processes", True, f"every process of a job ends with it and "
                      f"counts in its memory ({how})") if how else
           Protection("job_processes", False, "[supervisor].fork_server = false: what a job "
                      "leaves behind ends with the job, but not with a SIGKILLed supervisor "
                      "(namespaces or per-job cgroups end it)")]
    if job_cgroups:
        out.append(Protection("shared_memory", True, "memfd and /dev/shm files count in a "
                              "job's memory (its cgroup)"))
    elif readable_for(sb.run_as):
        out.append(Protection("shared_memory", True, "memfd and /dev/shm files a job holds "
                              "open count in its memory (sampled)"))
    else:
        out.append(Protection("shared_memory", False, f"the open files of jobs run as "
                              f"{sb.run_as} cannot be read without CAP_SYS_PTRACE: memfd "
                              "and /dev/shm files are not counted"))
    return out


def assess(config: Config, *, namespaces_problem: str | None, job_cgroups: bool,
           password_file: str | None = None,
           hidden: tuple[str, ...] = ()) -> list[Protection]:
    sb = config.sandbox
    root = os.geteuid() == 0
    out = []
    if sb.run_as:
        out.append(Protection("run_as", True, f"handler code runs as {sb.run_as}"))
    else:
        who = "root" if root else f"uid {os.geteuid()}"
        out.append(Protection("run_as", False, f"jobs run as the supervisor's user ({who}): "
                                               "[sandbox].run_as is not set"))
    allow = "only [sandbox].env_allow" if sb.env_allow is not None else "no FORQ_REDIS_*"
    out.append(Protection("scrubbed_env", True, f"handler code's environment scrubbed ({allow})"))
    out.append(_private_config(config, password_file, hidden))
    none_tasks = sorted(t for t, n in sb.task_network.items() if n == "none")
    wanted = sb.namespaces or sb.private_tmp or sb.network == "none" or bool(none_tasks) or any(
        q.network == "none" for q in config.queues)
    ns_on = wanted and namespaces_problem == ""
    if not wanted:
        why = "[sandbox].namespaces = false"
    elif namespaces_problem is None:
        why = "no fork server to set them up"
    else:
        why = namespaces_problem
    out.append(Protection("namespaces", ns_on, "a PID, mount and IPC namespace per job"
                          + (" (in a user namespace of its own)" if ns_on and (sb.run_as or not root)
                             else "") if ns_on else why))
    none_queues = [q.name for q in config.queues
                   if (q.network or sb.network) == "none"]
    where = ", ".join([*(f"queue {q}" for q in none_queues), *(f"task {t}" for t in none_tasks)])
    if where and ns_on:
        out.append(Protection("network", True, f"no network but loopback for {where}"))
    else:
        out.append(Protection("network", False, "[sandbox].network = \"host\"" if not where
                              else f"no namespaces: {why}"))
    if sb.private_tmp and ns_on:
        out.append(Protection("private_tmp", True,
                              f"a private /tmp and /dev/shm of {sb.tmp_size >> 20} MiB per job"))
    else:
        out.append(Protection("private_tmp", False, "[sandbox].private_tmp = false"
                              if not sb.private_tmp else f"no namespaces: {why}"))
    if not sb.max_processes:
        out.append(Protection("max_processes", False, "[sandbox].max_processes = 0"))
    else:
        how = ("RLIMIT_NPROC in the job's user namespace" if ns_on and (sb.run_as or not root)
               else "pids.max of the job's cgroup" if job_cgroups
               else "counted by sampling, over it killed")
        out.append(Protection("max_processes", True,
                              f"max_processes {sb.max_processes} per job ({how})"))
    out.extend(_job_processes(config, ns_on, job_cgroups))
    out.append(Protection("job_cgroups", job_cgroups, "memory.max, pids.max and cgroup.kill "
                          "per job" if job_cgroups else "no per-job cgroups (see the memory "
                          "limit line)"))
    return out


def line(protections: list[Protection], output_cap: int) -> str:
    on = [p.detail for p in protections if p.on]
    on.append(f"output captured ({output_cap >> 10} KiB logged per job)")
    off = [f"{p.name} ({p.detail})" for p in protections if not p.on]
    return "sandbox: on: " + "; ".join(on) + (". off: " + "; ".join(off) if off else "")


def missing(config: Config, protections: list[Protection]) -> list[Protection]:
    """The protections `[sandbox].require` names that are off."""
    by_name = {p.name: p for p in protections}
    return [by_name[name] for name in config.sandbox.require
            if name in by_name and not by_name[name].on]


def announce(config: Config, namespaces_problem: str | None, launcher: Any,
             hidden: tuple[str, ...] = ()) -> bool:
    """Log the start-up line of which protections are on and off, and why; False (exit
    2) if `[sandbox].require` names one that is off. Tells `launcher` whether the
    per-job namespaces can be used. `hidden`: the files the fork server made empty for
    every job (`ForkServer.hidden`)."""
    launcher.namespaces_ok = namespaces_problem == ""
    found = assess(config, namespaces_problem=namespaces_problem,
                   job_cgroups=launcher.cgroups is not None,
                   password_file=config.redis_password_file, hidden=hidden)
    log.info("%s", line(found, config.sandbox.max_output_bytes))
    off = missing(config, found)
    for p in off:
        log.error("refusing to start: [sandbox].require in %s names %s, which is off: %s",
                  config.path, p.name, p.detail)
    return not off
