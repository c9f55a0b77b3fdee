"""The registered tasks, as the fork server reports them to the supervisor.

The supervisor never imports handler modules (their top-level code is handler code);
the fork server does, and tells the supervisor which task names exist and with which
registration options, in its first message. Module top-level code may have tampered
with that process, so the table is read as untrusted input: checked, capped, and a
malformed one is refused whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_TASKS = 10_000
MAX_NAME = 300


@dataclass(frozen=True)
class TaskInfo:
    name: str
    idempotent: bool = False


class BadTaskTable(ValueError):
    """The fork server's task table is not what `describe` builds."""


def describe(registered: dict[str, Any]) -> dict[str, dict[str, bool]]:
    """The table the fork server sends (from `forq.registry.registered()`)."""
    return {name: {"idempotent": bool(spec.idempotent)} for name, spec in registered.items()}


def parse(raw: object) -> dict[str, TaskInfo]:
    """The supervisor's reading of a table from `describe`."""
    if not isinstance(raw, dict):
        raise BadTaskTable(f"tasks must be an object, got {type(raw).__name__}")
    if len(raw) > MAX_TASKS:
        raise BadTaskTable(f"{len(raw)} tasks, over the limit of {MAX_TASKS}")
    table = {}
    for name, options in raw.items():
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise BadTaskTable(f"a task name must be 1 to {MAX_NAME} characters: {name!r:.80}")
        if not isinstance(options, dict) or set(options) - {"idempotent"}:
            raise BadTaskTable(f"task {name!r:.80}: options must be {{\"idempotent\": bool}}")
        idempotent = options.get("idempotent", False)
        if not isinstance(idempotent, bool):
            raise BadTaskTable(f"task {name!r:.80}: idempotent must be true or false")
        table[name] = TaskInfo(name, idempotent)
    return table
