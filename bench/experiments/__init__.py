"""Experiments behind bench/RESULTS.md's findings — not part of `python -m bench`.

`patched_run` runs `forq run` with proposed fixes applied as monkeypatches (chosen with
FORQ_PATCHES), `forkserver` is the lean fork-server prototype it can use, and `ab`
drains the same jobs through the variants in turn:

    .venv/bin/python -m bench.experiments.ab --jobs 3000 --rounds 3 \\
        "" "noscriptexists,quietlog,notimerleak" "noscriptexists,quietlog,notimerleak,forkserver"

The patches reach into supervisor internals as they were on 2026-11-29; they show what a
fix is worth, they are not the fix.
"""
