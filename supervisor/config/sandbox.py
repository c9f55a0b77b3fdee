"""The `[sandbox]` table: what each child gives up before its handler runs (the user it
runs as, the environment it keeps, its namespaces, network, /tmp, process and output
caps), and which of those protections the supervisor refuses to start without."""

from __future__ import annotations

import json
import pwd
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from forq.supervisor.config import fields as read

SANDBOX_KEYS = ("run_as", "env_allow", "max_open_files", "namespaces", "network",
                "private_tmp", "tmp_size", "max_processes", "max_output_bytes", "require",
                "tasks")
NETWORKS = ("host", "none")
# what `[sandbox].require` may name (supervisor/isolation/protections.py says which are on)
PROTECTIONS = ("run_as", "scrubbed_env", "private_config", "namespaces", "network", "private_tmp",
               "max_processes", "job_processes", "shared_memory", "job_cgroups")


@dataclass(frozen=True)
class SandboxConfig:
    """Restrictions applied in each child before the handler runs.

    Every field is optional: ``run_as=None`` keeps the supervisor's user,
    ``env_allow=None`` keeps the whole environment (a list keeps only those
    variables), ``max_open_files=None`` keeps the inherited RLIMIT_NOFILE.
    """

    run_as: str | None = None
    env_allow: tuple[str, ...] | None = None
    max_open_files: int | None = None
    namespaces: bool = False  # PID, mount and IPC namespaces per job (fork/namespaces.py)
    network: str = "host"  # "none": each job in a network namespace with only loopback
    private_tmp: bool = False  # a size-capped tmpfs per job on /tmp and /dev/shm
    tmp_size: int = 64 << 20
    max_processes: int = 256  # per job
    max_output_bytes: int = 1 << 20  # stdout + stderr logged per job; the rest dropped
    require: tuple[str, ...] = ()  # protections the supervisor refuses to start without
    # [sandbox.tasks."name"] network = "none" | "host": per task, over the queue's
    task_network: dict[str, str] = field(default_factory=dict)


def read_sandbox(doc: Mapping[str, Any]) -> SandboxConfig:
    table = read.table(doc.get("sandbox", {}), "[sandbox]")
    read.check_keys(table, SANDBOX_KEYS, "[sandbox]")
    run_as = table.get("run_as")
    if run_as is not None:
        read.string(run_as, "[sandbox].run_as", "a user name")
        try:
            pwd.getpwnam(run_as)
        except KeyError:
            raise read.Invalid(f'[sandbox].run_as: no such user "{run_as}" on this machine') from None
    env_allow = table.get("env_allow")
    if env_allow is not None:
        env_allow = tuple(
            read.string_list(env_allow, "[sandbox].env_allow", "environment variable names")
        )
    max_open_files = table.get("max_open_files")
    if max_open_files is not None:
        max_open_files = read.integer(max_open_files, "[sandbox].max_open_files", 16)
    flags = {}
    for key in ("namespaces", "private_tmp"):
        flags[key] = table.get(key, False)
        if not isinstance(flags[key], bool):
            raise read.expected(f"[sandbox].{key}", "true or false", flags[key])
    require = tuple(read.string_list(table.get("require", []), "[sandbox].require",
                                 "protection names"))
    for name in require:
        if name not in PROTECTIONS:
            raise read.Invalid(f"[sandbox].require: unknown protection {json.dumps(name)}; "
                           f"expected some of {', '.join(PROTECTIONS)}")
    task_network = {}
    for task, value in read.table(table.get("tasks", {}), "[sandbox.tasks]").items():
        where = f"[sandbox.tasks.{json.dumps(task, ensure_ascii=False)}]"
        options = read.table(value, where)
        read.check_keys(options, ("network",), where)
        if "network" in options:
            task_network[task] = read.choice(options["network"], f"{where}.network", NETWORKS)
    return SandboxConfig(
        run_as=run_as, env_allow=env_allow, max_open_files=max_open_files,
        task_network=task_network,
        network=read.choice(table.get("network", "host"), "[sandbox].network", NETWORKS),
        tmp_size=read.size(table.get("tmp_size", "64MiB"), "[sandbox].tmp_size", minimum=1 << 20),
        max_processes=read.integer(table.get("max_processes", 256), "[sandbox].max_processes", 0),
        max_output_bytes=read.size(table.get("max_output_bytes", "1MiB"),
                               "[sandbox].max_output_bytes"),
        require=require, **flags)
