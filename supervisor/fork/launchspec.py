"""Launch: how job processes are started, decided by the supervisor (`Launcher`) and
read by the fork server at its start (`settings`, in its exec environment).

What the fork server (or a child exec'd alone) imports, as whom, with which environment
(`environment.fork_server_env`, plus what `hugepages` needs there), whether it tries
namespaces, and how many spare children it keeps. A reload that changes any compared
field starts a new fork server.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from forq.supervisor.fork import hugepages


@dataclasses.dataclass(frozen=True)
class Launch:
    """How job processes are started: what the fork server (or a child exec'd alone)
    imports, as whom, and with which environment (`environment.fork_server_env`)."""

    imports: tuple[str, ...] = ()
    run_as: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    # jobs get namespaces: the fork server tries them once at start (network, private_tmp)
    probe: tuple[bool, bool] | None = None
    # idle children the fork server keeps forked in advance (`Launcher.spares` says how
    # many); not compared: a reload that changes only concurrency keeps its fork server
    spares: int = dataclasses.field(default=0, compare=False)
    # the fork server's heap on huge pages (`hugepages`)
    huge_pages: bool = True

    def settings(self, added: dict[str, str | None] | None = None) -> str:
        """The fork server's settings; `added`: the variables its exec environment
        gained for it (name → the value the environment had, None if none), which it
        puts back once started, so that no job or process a job starts inherits them."""
        probe = None if self.probe is None else dict(zip(("network", "private_tmp"),
                                                         self.probe, strict=True))
        return json.dumps({"path": sys.path, "imports": list(self.imports),
                           "run_as": self.run_as, "probe": probe, "spares": self.spares,
                           "huge_pages": self.huge_pages, "restore_env": added or {}})

    def server_env(self) -> dict[str, str]:
        """The fork server's exec environment: `env`, what `huge_pages` needs there, and
        its settings (FORQ_FORKSERVER)."""
        env = dict(self.env)
        with_pages = hugepages.exec_env(env) if self.huge_pages else env
        added = {k: env.get(k) for k, v in with_pages.items() if env.get(k) != v}
        return dict(with_pages, FORQ_FORKSERVER=self.settings(added))
