"""forq.supervisor: the long-running process (one per machine) that leases jobs, forks
one child per job, keeps the leases alive, enforces limits and reports every end.

`supervisor.Supervisor` builds the parts below with their collaborators and runs the
loop; each subpackage's docstring is its own map.

| subpackage | duty |
| --- | --- |
| `loop/` | the event loop, timers, wake-ups, drain, reload, sd_notify, heartbeat, logs |
| `redis_io/` | the one round trip a turn: claims, reports, steps, reaper, relay, cron, roster, Redis and shard health |
| `leases/` | the leases held: keeper, renewal, fencing, prefetch |
| `children/` | each job's child: launch, spawn, watch, classify its end, its output |
| `isolation/` | memory and time limits, cgroups, the protections line |
| `fork/` | the fork server (a separate lean process) and each job's child set-up |
| `config/` | the TOML configuration |
| `observe/` | metrics and tracing |
| `cli/` | the `forq` command |
"""
