"""Real supervisors for forq's own tests: `forq.testing.supervisor` with the test
handler modules preloaded and the checkout on the import path."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from forq.testing import supervisor as harness
from forq.testing.supervisor import children_of, fork_servers_of, spares_of, wait_children

REPO = Path(__file__).resolve().parent.parent
TEST_IMPORTS = ("forq.examples", "tests.tasks", "tests.hostile")
# in the test VMs (software emulation, at nice 10 beside the suite: tests/background.py)
# a supervisor's start is a few interpreters' start-up at a tenth of the speed
READY_TIMEOUT = 180.0 if os.environ.get("FORQ_IN_VM") == "1" else 60.0

__all__ = ["REPO", "SupervisorProcess", "children_of", "fork_servers_of", "now",
           "spares_of", "wait_children", "write_config"]


def write_config(path: Path, redis_url: str, queues: dict[str, int], *,
                 imports: tuple[str, ...] = TEST_IMPORTS, **options: Any) -> Path:
    return harness.write_config(path, redis_url, queues, imports=imports, **options)


class SupervisorProcess(harness.SupervisorProcess):
    """Runs from the checkout, so `tests.*` handler modules import."""

    def __init__(self, config: Path, env: dict[str, str] | None = None,
                 cgroup: str | None = None, **options: Any) -> None:
        env = dict(env or {})
        path = [str(REPO), *filter(None, [env.get("PYTHONPATH", "")])]
        super().__init__(config, dict(env, PYTHONPATH=os.pathsep.join(path)), cgroup,
                         cwd=str(REPO), **options)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        super().wait_ready(max(timeout, READY_TIMEOUT))


def now() -> float:
    return time.monotonic()
