"""forq's handler module for the application-size benchmark: the benchmark's tasks
(`bench.tasks`), and the application named by BENCH_APP built at import, so it lives in
the fork server's heap and every job's child inherits it, as a real app's would."""

from __future__ import annotations

from bench import tasks  # noqa: F401 — registers bench.noop & co.
from bench.apps import load_from_env

LOADED = load_from_env()
