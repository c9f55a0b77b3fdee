"""forq's chaos harness: load, random kills, and an invariant checker.

``python -m chaos`` starts its own Redis (AOF, ``appendfsync always``), N supervisors
and a producer, injects faults at seeded random times, waits for the queue to settle,
then checks the recorded history of every execution against Redis. See
``chaos/run.py`` for the orchestration and ``chaos/checker.py`` for the invariants.

This package is imported by the chaos supervisors (``imports = ["chaos.handlers"]``),
so it imports nothing here.
"""
