"""How the supervisor shows itself: its status line (systemd's STATUS=), its process
title, and the queue depths its metrics read from Redis at scrape time."""

from __future__ import annotations

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


def read_depths(client: Any, names: list[str]) -> dict[str, dict[str, int]]:
    """Each queue's jobs by state, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        k = QueueKeys(name)
        for key in (k.pending, k.scheduled, k.active, k.dead):
            pipe.zcard(key)
    replies = pipe.execute()
    return {name: dict(zip(DEPTH_STATES, replies[4 * i:4 * i + 4], strict=True))
            for i, name in enumerate(names)}
