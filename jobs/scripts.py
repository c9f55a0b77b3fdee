"""Load the Lua transitions from ``lua/`` and call them by SHA.

The scripts are the only code that changes job state. redis-py's `Script` sends
EVALSHA and reloads the source on NOSCRIPT (after a Redis restart or failover),
inside pipelines too. ``--@include NAME`` lines are replaced by ``NAME.lua`` so the
shared helpers live in one file, the way BullMQ's includes do.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path

import redis

_INCLUDE = re.compile(r"^--@include (\w+)\s*$", re.MULTILINE)

TRANSITIONS = (
    "enqueue",
    "claim",
    "extend",
    "ack",
    "fail",
    "expire",
    "reclaim",
    "release",
    "cancel",
    "requeue_dead",
    "purge_dead",
)


def _lua_dir() -> Path:
    try:
        path = Path(str(resources.files("forq_lua")))
        if (path / "claim.lua").exists():
            return path
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parent.parent / "lua"


@cache
def source(name: str) -> str:
    """The script's text with its includes expanded."""
    directory = _lua_dir()
    text = (directory / f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda m: (directory / f"{m.group(1)}.lua").read_text(), text)


class Scripts:
    """The transitions registered on one client, callable as attributes."""

    def __init__(self, client: redis.Redis) -> None:
        for name in TRANSITIONS:
            setattr(self, name, client.register_script(source(name)))
