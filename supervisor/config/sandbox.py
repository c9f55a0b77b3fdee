"""The `[sandbox]` table: what each child gives up before its handler runs (the user it
runs as, the environment it keeps, its namespaces, network, /tmp, process and output
caps), and which of those protections the supervisor refuses to start without."""

from __future__ import annotations

import json
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forq.supervisor.config import fields as read
from forq.supervisor.config import schema
from forq.supervisor.config.schema import Key, key

NETWORKS = ("host", "none")
# what `[sandbox].require` may name (supervisor/isolation/protections.py says which are on)
PROTECTIONS = ("run_as", "scrubbed_env", "private_config", "namespaces", "network", "private_tmp",
               "max_processes", "job_processes", "shared_memory", "job_cgroups")


def _run_as(value: object, where: str) -> str:
    user = read.string(value, where, "a user name")
    try:
        pwd.getpwnam(user)
    except KeyError:
        raise read.Invalid(f'{where}: no such user "{user}" on this machine') from None
    return user


def _env_allow(value: object, where: str) -> tuple[str, ...]:
    return tuple(read.string_list(value, where, "environment variable names"))


def _require(value: object, where: str) -> tuple[str, ...]:
    names = tuple(read.string_list(value, where, "protection names"))
    for name in names:
        if name not in PROTECTIONS:
            raise read.Invalid(f"{where}: unknown protection {json.dumps(name)}; "
                               f"expected some of {', '.join(PROTECTIONS)}")
    return names


# [sandbox.tasks."name"]: what one task changes
TASK_ROWS = (
    Key("network", read.choices(*NETWORKS), None,
        "The task's network, over its queue's and `[sandbox]`'s.",
        ('[sandbox.tasks."name"]',), attr="network"),
)


def _task_networks(value: object, where: str) -> dict[str, str]:
    networks = {}
    for task, options in read.table(value, "[sandbox.tasks]").items():
        here = f"[sandbox.tasks.{json.dumps(task, ensure_ascii=False)}]"
        found = schema.read_rows(read.table(options, here), TASK_ROWS, here)
        if "network" in found:
            networks[task] = found["network"]
    return networks


@dataclass(frozen=True)
class SandboxConfig:
    """Restrictions applied in each child before the handler runs; each field is the
    row of its `[sandbox]` key. All optional: by default a job keeps the supervisor's
    user, environment, RLIMIT_NOFILE and namespaces."""

    run_as: str | None = key(None, read.Reader("a user name", _run_as),
                             "Handler code (the fork server and every job) runs as this user.")
    env_allow: tuple[str, ...] | None = key(
        None, read.Reader("a list of environment variable names", _env_allow),
        "Only these environment variables reach handler code (`FORQ_REDIS_*` never do).")
    max_open_files: int | None = key(None, read.integers(16),
                                     "RLIMIT_NOFILE of each child (unset: inherited).")
    namespaces: bool = key(False, read.BOOLEAN,
                           "Each job in PID, mount and IPC namespaces of its own.")
    network: str = key("host", read.choices(*NETWORKS),
                       '`"none"`: each job in a network namespace with only loopback.')
    private_tmp: bool = key(False, read.BOOLEAN,
                            "A private tmpfs on /tmp and /dev/shm per job.")
    tmp_size: int = key("64MiB", read.sizes(minimum=1 << 20), "The size of that tmpfs.")
    max_processes: int = key(256, read.integers(0), "Processes per job (0: no limit).")
    max_output_bytes: int = key("1MiB", read.sizes(),
                                "stdout + stderr logged per job; the rest is dropped, counted.")
    require: tuple[str, ...] = key(
        [], read.Reader("a list of: " + ", ".join(PROTECTIONS), _require),
        "Protections the supervisor refuses to start without.")
    task_network: dict[str, str] = key(
        {}, read.Reader('tables [sandbox.tasks."name"]', _task_networks),
        'Per task: `[sandbox.tasks."name"]`, below.', name="tasks")


ROWS = schema.rows(SandboxConfig, "[sandbox]")


def read_sandbox(doc: Mapping[str, Any]) -> SandboxConfig:
    table = read.table(doc.get("sandbox", {}), "[sandbox]")
    return SandboxConfig(**schema.read_rows(table, ROWS, "[sandbox]"))
