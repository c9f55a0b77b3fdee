"""How the supervisor shows itself: its status line (systemd's STATUS=), its process
title, and the queue depths its metrics read from Redis at scrape time."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forq.store.keys import QueueKeys

DEPTH_STATES = ("pending", "scheduled", "active", "dead")


def status_line(draining: bool, busy: int, slots: int) -> str:
    return f"{'draining' if draining else 'running'}: {busy}/{slots} busy"


def set_title(name: str, busy: int, slots: int) -> None:
    try:
        import setproctitle

        setproctitle.setproctitle(f"forq: supervisor {name} [{busy}/{slots}]")
    except Exception:  # noqa: BLE001 — a title is cosmetic
        pass


def read_depths(client: Any, names: list[str],
                on_tripped: Callable[[str, list[str]], None] | None = None,
                ) -> dict[str, dict[str, int]]:
    """Each queue's jobs by state, in one round trip; with `on_tripped`, each queue's
    tasks its circuit breaker tripped (lua/includes/breaker.lua) are told to it too."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        k = QueueKeys(name)
        for key in (k.pending, k.scheduled, k.active, k.dead):
            pipe.zcard(key)
        if on_tripped is not None:
            pipe.hkeys(k.tripped)
    replies = pipe.execute()
    step = 4 if on_tripped is None else 5
    out = {}
    for i, name in enumerate(names):
        out[name] = dict(zip(DEPTH_STATES, replies[step * i:step * i + 4], strict=True))
        if on_tripped is not None:
            on_tripped(name, list(replies[step * i + 4]))
    return out
