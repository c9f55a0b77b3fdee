"""How the fork server is started (`Launch`), and the environment block it gets.

A job's child is forked from the fork server, and `/proc/self/environ` shows the
environment its process image was *exec'd* with, whatever `os.environ` says later: a
variable removed in the child is still readable there. So the scrubbing happens
before the exec of the fork server, here, and what the fork server never had no job
can find.

Never passed on: the Redis password and URL (`FORQ_REDIS_*`), any variable whose value
holds the password, and systemd's per-service variables (notify socket, credentials,
listen fds). With `[sandbox].env_allow`, only the variables it names are passed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Mapping

from forq.supervisor.fork import hugepages

# systemd's per-service variables: a job must not notify, or find the credentials
SERVICE_VARS = frozenset({
    "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
    "LISTEN_FDNAMES", "CREDENTIALS_DIRECTORY", "INVOCATION_ID", "JOURNAL_STREAM",
})


def fork_server_env(environ: Mapping[str, str], env_allow: Iterable[str] | None,
                    secrets: Iterable[str | None] = ()) -> dict[str, str]:
    """The environment for the fork server: `environ` less what a job must not see."""
    allowed = None if env_allow is None else set(env_allow)
    hidden = [s for s in secrets if s]
    env = {}
    for name, value in environ.items():
        if allowed is not None and name not in allowed:
            continue
        if name.startswith("FORQ_REDIS") or name in SERVICE_VARS:
            continue
        if any(secret in value for secret in hidden):
            continue
        env[name] = value
    return env


def restore(added: object) -> None:
    """In the fork server, once started: put back the variables the supervisor added to
    its exec environment for it alone (`Launch.server_env`; name → the value before, None
    if there was none): a job, and what a job runs, must not inherit them."""
    if not isinstance(added, dict):
        return
    for name, value in added.items():
        if value is None:
            os.environ.pop(name, None)
        elif isinstance(value, str):
            os.environ[name] = value


@dataclasses.dataclass(frozen=True)
class Launch:
    """How job processes are started: what the fork server (or a child exec'd alone)
    imports, as whom, and with which environment (`environment.fork_server_env`)."""

    imports: tuple[str, ...] = ()
    run_as: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    # jobs get namespaces: the fork server tries them once at start (network, private_tmp)
    probe: tuple[bool, bool] | None = None
    # files no job may read (the config, the password file): /dev/null in the mount
    # namespace of a fork server that makes one (`namespaces.become_init`)
    hide: tuple[str, ...] = ()
    # idle children the fork server keeps forked in advance (`Launcher.spares` says how
    # many); not compared: a reload that changes only concurrency keeps its fork server
    spares: int = dataclasses.field(default=0, compare=False)
    # [supervisor].version: named with the fork server's fingerprint (`code_name`)
    version: str = dataclasses.field(default="", compare=False)
    # the fork server's memory on huge pages (`hugepages`)
    huge_pages: bool = True

    def settings(self, added: dict[str, str | None] | None = None) -> str:
        """The fork server's settings; `added`: the variables its exec environment
        gained for it (name → the value the environment had, None if none), which it
        puts back once started (`environment.restore`): no job inherits them."""
        probe = None if self.probe is None else dict(zip(("network", "private_tmp"),
                                                         self.probe, strict=True))
        return json.dumps({"path": sys.path, "imports": list(self.imports),
                           "run_as": self.run_as, "probe": probe, "spares": self.spares,
                           "huge_pages": self.huge_pages, "restore_env": added or {},
                           "hide": list(self.hide)})

    def server_env(self) -> dict[str, str]:
        """The fork server's exec environment: `env`, what `huge_pages` needs there
        (`hugepages.exec_env`), and its settings (FORQ_FORKSERVER)."""
        env = dict(self.env)
        with_pages = hugepages.exec_env(env) if self.huge_pages else env
        added = {k: env.get(k) for k, v in with_pages.items() if env.get(k) != v}
        return dict(with_pages, FORQ_FORKSERVER=self.settings(added))


_SYSTEMD_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS",
                 "LISTEN_PID", "LISTEN_FDNAMES")


def scrub_service_vars() -> None:
    """No systemd per-service variables in a job's `os.environ` (the fork server was
    exec'd without them, `environment.py`; a handler module's top-level code may have
    set them since): done once, in the fork server after it imported them, not in every
    child, where each `os.environ.pop` of an absent name cost 40 µs."""
    for name in _SYSTEMD_VARS:
        os.environ.pop(name, None)
