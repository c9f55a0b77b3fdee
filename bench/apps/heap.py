"""A heap of small Python objects, built at import time as an application's is: model
classes' metadata, routing tables, caches, parsed settings — many small instances,
dicts, strings and tuples, not one big buffer.

    build(mib)   # about `mib` MiB of them (under CPython's own allocator), kept alive

The object count is fixed per MiB (`ITEMS_PER_MIB`, measured under pymalloc), so the
same "application" is the same objects whichever allocator runs it: what another
allocator does to its size is part of what it costs, and is reported as RSS.
"""

from __future__ import annotations

# items (a Field instance with its dict, two strings, a float, a tuple) per MiB of RSS
# under pymalloc on CPython 3.11 x86-64 (measured: 300 MiB asked, 300-305 MiB grown)
ITEMS_PER_MIB = 2640

HEAP: list = []  # what is built stays referenced here, as a module's globals would


class Field:
    """One small object with a __dict__, like a model field or a route."""

    def __init__(self, name: str, column: str, index: int, weight: float,
                 choices: tuple) -> None:
        self.name = name
        self.column = column
        self.index = index
        self.weight = weight
        self.choices = choices


def build(mib: float) -> int:
    """Build about `mib` MiB of small objects into `HEAP`; returns how many items."""
    n = int(mib * ITEMS_PER_MIB)
    heap = HEAP
    table: dict[str, Field] = {}
    for i in range(n):
        name = f"field_{i}"
        f = Field(name, f"col_{i % 977}_{i}", i, i * 0.5, (name, i & 0xFF))
        if i % 8 == 0:  # some lookup tables too, as registries keep
            table[name] = f
        heap.append(f)
    heap.append(table)
    return n
