"""forq benchmarks (not tests): `python -m bench` measures forq beside RQ, Celery and
Dramatiq and beside the machine's own limits, in one run, and writes bench/RESULTS.md.

    python -m bench [--quick]          # everything; peers run from bench/.venv-peers
    python -m bench.supervisor         # the supervisor alone (issue 3's figures)

Modules: `common` (Redis server, timing, stats), `tasks` (the forq handlers the
benchmarks enqueue), `forkrate` (the raw fork+waitpid limit), `supervisor` (forq end
to end), `scale` (claim+ack at big backlogs), `peers` (the other queues, run in their
own venv), `report` (RESULTS.md). `core.py` is the core (enqueue, claim+ack) benchmark.
`appsize` forks with a real application loaded (`apps`: a heap of a given size, or
Django + pandas + numpy) beside RQ's forking worker and Dramatiq; `prefetch` measures
what prefetch buys and what it costs a fleet's latency; `childcost` one job's child;
`retention` what an ended job keeps in Redis, flat memory under load, a poison storm
(bench/RESULTS-retention.md).
"""
