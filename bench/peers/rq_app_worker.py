"""RQ's forking worker for a big application, as RQ's docs advise ("Performance
notes"): a worker script that imports the application before it starts, so that each
work horse it forks inherits it instead of importing it for each job.

    python rq_app_worker.py REDIS_URL NAME QUEUE...     (the app: $BENCH_APP, bench.apps)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # bench.apps

from bench.apps import load_from_env  # noqa: E402

load_from_env()  # the application, preloaded

import peer_tasks  # noqa: E402, F401 — the job functions, preloaded too
from redis import Redis  # noqa: E402
from rq import Worker  # noqa: E402


def main(argv: list[str]) -> None:
    url, name, *queues = argv
    Worker(queues, connection=Redis.from_url(url), name=name).work()


if __name__ == "__main__":
    main(sys.argv[1:])
