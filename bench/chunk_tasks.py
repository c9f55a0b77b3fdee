"""The chunked no-op (docs/guide/chunks.md), in a module of its own: a supervisor that
registers a chunked task claims up to its chunk per free slot at first
(`children.chunks.ClaimWidth`), which the other benchmarks must not see."""

from __future__ import annotations

from forq import task

CHUNK = 32  # `forq.registry.MAX_CHUNK`


@task("bench.noop_chunk", chunk=CHUNK)
def noop_chunk(_jobs) -> None:
    """A no-op as a chunked handler: every job of the chunk succeeds."""
    return None
