"""An enqueue's idempotency key and what it does when another job holds it: the
producer's options `key`, `unique_for`, `replace`, `debounce` and `key_scope`, checked
into the spec fields the enqueue script reads (lua/includes/replace.lua acts on them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forq.errors import PayloadError
from forq.units import UnitError, parse_duration

KEY_SCOPES = ("live", "queued")  # what a key covers: its job until it ends, or until it starts
# options only a producer's enqueue takes (a batch member, a callback or a handler's
# follow-up is enqueued by a script that does not replace)
PRODUCER_ONLY = ("replace", "debounce", "key_scope")


def ms(value: Any, where: str) -> int:
    """A duration option in milliseconds, or a PayloadError naming it."""
    try:
        return int(round(parse_duration(value, where=where) * 1000))
    except UnitError as exc:
        raise PayloadError(str(exc)) from None


def keyed(task: str, options: Mapping[str, Any], spec: dict[str, Any]) -> None:
    """key and what it does when held (lua/includes/replace.lua): unique_for keeps it
    after the job ends; replace=True updates the holder that has not started yet with
    this call's arguments (and delay or run_at, if given); debounce="5s" is delay="5s"
    with replace and key_scope "queued": one run, 5 s after the last call, with the last
    call's arguments; key_scope "queued" frees the key of a job once it runs."""
    key = options.get("key")
    given = [name for name in PRODUCER_ONLY if options.get(name) not in (None, False)]
    if key is None:
        if given:
            raise PayloadError(f"task {task!r}: {given[0]} needs key= (the jobs it "
                               "replaces or debounces share their key)")
        return
    key = str(key)
    if not key:
        raise PayloadError(f"task {task!r}: key must not be empty")
    spec["key"] = key
    if options.get("unique_for") is not None:
        spec["unique_ms"] = ms(options["unique_for"], "unique_for")
    scope = options.get("key_scope")
    if scope is not None and scope not in KEY_SCOPES:
        raise PayloadError(f"task {task!r}: key_scope must be one of "
                           f"{', '.join(map(repr, KEY_SCOPES))}, got {scope!r}"[:300])
    debounce = options.get("debounce")
    if debounce is not None:
        if options.get("delay") is not None or options.get("run_at") is not None:
            raise PayloadError(f"task {task!r}: debounce is the job's delay; give debounce "
                               "or delay / run_at, not both")
        if isinstance(debounce, bool):
            raise PayloadError(f"task {task!r}: debounce must be a duration, got {debounce!r}")
        spec["delay_ms"] = ms(debounce, "debounce")
        if spec["delay_ms"] <= 0:
            raise PayloadError(f"task {task!r}: debounce must be more than 0, got {debounce!r}")
        spec["replace"] = 1
        scope = scope or "queued"
    elif options.get("replace") is not None:
        if not isinstance(options["replace"], bool):
            raise PayloadError(f"task {task!r}: replace must be True or False, "
                               f"got {options['replace']!r}"[:300])
        if options["replace"]:
            spec["replace"] = 1
    if scope == "queued":
        spec["key_scope"] = "queued"
