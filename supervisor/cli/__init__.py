"""The `forq` command: `main` parses, one module per family of subcommands.

| module | what it is |
| --- | --- |
| `main` | `main()`: the parser, logging, and the dispatch to a command |
| `base` | what every command shares: errors, the Redis client, the config, JSON |
| `jobs` | forq run, job, cancel |
| `enqueue` | forq enqueue (registered by `jobs`, after run): one job with any option, many from a file, or a batch |
| `change` | forq promote, priority, reschedule: one job changed before it runs |
| `find` | forq jobs: find jobs by state, task, error, age, argument; act on all of them |
| `batches` | forq batch |
| `stats` | forq stats, supervisors (alias workers), schedules, events (a queue's events, `--follow`; its events settings) |
| `schedule` | forq schedule add, remove, pause, resume, trigger, list: schedules at run time |
| `dead` | forq dead list, show, requeue, purge |
| `operate` | forq limit, pause, resume, web, config check |
| `replay` | forq replay: a finished job run again here, nothing recorded |
| `render` | human-readable views of jobs, queues, supervisors, schedules |
| `terminal` | where human output goes: rich on a terminal, plain text elsewhere |
| `demo` | `make demo` |
| `usage/` | forq usage, top: what jobs cost, kept and live (a package: its own map) |

Each family module has ``cmd_*`` functions (argparse Namespace in, exit code out) and a
``register(sub, parents)`` that adds its parsers; `main` calls every module's
``register`` in the order of `FAMILIES`, which is the order of ``forq --help``.
A new command goes into the module of its family, or a new module listed here.
"""

from __future__ import annotations

FAMILIES = ("jobs", "change", "find", "batches", "stats", "schedule", "dead", "operate",
            "replay", "usage.totals", "usage.top")
