"""The `forq` command's subcommands, one module per family.

Each module has ``cmd_*`` functions (argparse Namespace in, exit code out) and a
``register(sub, parents)`` that adds its parsers; `forq.supervisor.cli` calls every
module's ``register`` in the order of `FAMILIES`, which is the order of ``forq --help``.
A new command goes into the module of its family, or a new module listed here.
"""

from __future__ import annotations

FAMILIES = ("jobs", "batches", "stats", "dead", "operate")
