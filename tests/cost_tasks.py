"""Handlers for tests/test_job_cost.py: known CPU time and memory, in the job's child
and in a grandchild it waits for."""

from __future__ import annotations

import subprocess
import sys
import time

from forq import NonRetryable, current, task

MIB = 1 << 20
# burns `s` seconds of its own CPU time (process time: what rusage counts), then exits
_BURN = "import sys, time\nend = time.process_time() + float(sys.argv[1])\n" \
        "while time.process_time() < end: pass\n"


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


@task("cost.burn")
def burn(seconds: float, mib: int, grandchild_seconds: float = 0.0) -> int:
    """Touch `mib` MiB (every page), burn `seconds` of CPU here and
    `grandchild_seconds` in a grandchild process."""
    block = bytearray(mib * MIB)
    block[::4096] = b"\x01" * len(range(0, len(block), 4096))  # every page resident
    _burn(seconds)
    if grandchild_seconds:
        subprocess.run([sys.executable, "-c", _BURN, str(grandchild_seconds)], check=True)
    return len(block)


@task("cost.burn_then_fail")
def burn_then_fail(seconds: float) -> None:
    _burn(seconds)
    raise NonRetryable("burnt, then failed")


@task("cost.burn_then_crash")
def burn_then_crash(seconds: float) -> None:
    import os

    _burn(seconds)
    os._exit(3)


@task("cost.spin")
def spin(seconds: float, mib: int) -> None:
    """Hold `mib` MiB and keep a core busy for `seconds` (wall), halfway said."""
    block = bytearray(mib * MIB)
    block[::4096] = b"\x01" * len(range(0, len(block), 4096))
    current().progress(0.5, "halfway")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
