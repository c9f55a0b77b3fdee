"""What jobs cost: `forq usage` (the totals kept in Redis, per group) and `forq top`
(the running jobs, live). Registered by `forq.supervisor.cli.main` like the other
families (``usage.totals``, ``usage.top`` in `FAMILIES`).

| module | what it is |
| --- | --- |
| `totals` | forq usage QUEUE [--group G] [--since 1d]: CPU, jobs, peak memory and wall time per group |
| `lines` | `cost_line`, `cost_rows`: a run's cost on one line, for `forq job` |
| `top` | forq top: the running jobs of every live supervisor, refreshed in place (`--once`) |
"""
