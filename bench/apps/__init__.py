"""What the application-size benchmark (`bench/appsize.py`) loads into a worker, as a
real application's import would: `heap` builds a heap of small Python objects of a
given size, `real` imports Django (with an app and its models), pandas and numpy.

`load(spec)` / `load_from_env()` (BENCH_APP): "heap:MiB" or "real" ("" loads nothing).
forq's fork server gets it through its handler module `bench.apps.forq_app`, RQ's work
horses through `bench/peers/rq_app_worker.py`, Dramatiq's processes through
`bench/peers/dramatiq_app.py`. Stdlib only at import: the peers' venv imports it too.
"""

from __future__ import annotations

import importlib
import os

ENV = "BENCH_APP"


def load(spec: str) -> str:
    """Load the application `spec` names into this process; returns what it loaded."""
    if not spec:
        return ""
    if spec.startswith("heap:"):
        from bench.apps import heap

        items = heap.build(float(spec.split(":", 1)[1]))
        return f"{items} heap items"
    if spec == "real":
        real = importlib.import_module("bench.apps.real")
        return f"Django ({len(real.MODELS)} shop models), pandas, numpy"
    raise ValueError(f"{ENV}={spec!r}: expected heap:MiB or real")


def load_from_env() -> str:
    return load(os.environ.get(ENV, ""))
