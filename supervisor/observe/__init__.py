"""How the supervisor is seen from outside: metrics and traces.

| module | what it is |
| --- | --- |
| `metrics` | the Prometheus registry of the parent (children never touch it) |
| `depths` | `forq_queue_jobs`: queue depths read from Redis when scraped |
| `metrics_cost` | each job attempt's cost per task: CPU time, peak memory, start latency |
| `metrics_memory` | admission by memory: the budget, what it admitted, jobs waiting for room |
| `retention` | the retained records and Redis's headroom, read at scrape time |
| `metrics_server` | the HTTP endpoint for `/metrics`, on the supervisor's own loop |
| `tracing` | OpenTelemetry job spans (`[tracing]`) |
"""
