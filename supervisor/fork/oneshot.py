"""One job's child exec'd alone, without a fork server (`alone.spawn`):

    python -m forq.supervisor.fork.oneshot     (spec on fd 0, result pipe on fd 3)

(`forq replay` passes the spec on another fd, FORQ_SPEC_FD, keeping stdin.)

For `[supervisor].fork_server = false`, and while no fork server can be had. A fresh
interpreter rather than a fork of the supervisor, whose memory holds the Redis
password and connection: it reads its spec, sets up its sandbox (dropping to `run_as`),
and only then imports the handler modules (`ChildSpec.imports`) and runs the job.
"""

from __future__ import annotations

import json
import os
import sys

from forq.supervisor.fork import sandbox
from forq.supervisor.fork.child import ChildSpec, run_child


def main() -> None:
    try:
        settings = json.loads(os.environ.pop("FORQ_FORKSERVER", "{}"))
        if settings.get("path"):
            sys.path[:] = settings["path"]
        spec_fd = int(os.environ.pop("FORQ_SPEC_FD", "0"))  # 4 for `forq replay --pdb`
        chunks = []
        while chunk := os.read(spec_fd, 1 << 20):
            chunks.append(chunk)
        message = json.loads(b"".join(chunks))
        spec = ChildSpec(**message["spec"])
        sandbox.prepare()
    except BaseException:  # noqa: BLE001 — the parent sees an exit without a report
        os._exit(71)
    run_child(spec, 3, int(message["parent"]), str(message["title"]))


if __name__ == "__main__":
    main()
