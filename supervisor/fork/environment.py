"""The environment block the fork server is started with.

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

import os
from collections.abc import Iterable, Mapping

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
