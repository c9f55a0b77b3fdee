"""What `make demo` and `make web` share: headings that are bold only on a terminal, and
stopping every process a demo started when it ends, however it ends.

A demo is ended by Ctrl-C, by SIGTERM (``kill``, a CI's timeout, ``make`` passing its
own SIGTERM on), or by finishing. Python's default for SIGTERM ends the process at once,
skipping every ``finally``, so the Redis, supervisors and web server a demo started
outlived it. Inside `signals_stop()` both signals raise `Stopped` (a KeyboardInterrupt)
in the main thread, and the demo's ``finally`` calls `stop_all`, which stops what was
started within a bounded time. While it does, a further signal only hurries it on
(SIGKILL for what is left) instead of interrupting the cleanup itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def escapes_allowed() -> bool:
    """The CLI's rule (forq.supervisor.cli.terminal.interactive, which forq.testing may not
    import): stdout a terminal, not dumb, and no NO_COLOR (set and not empty)."""
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb" and not os.environ.get("NO_COLOR")


def say(text: str) -> None:
    """A demo's heading: bold on a terminal, plain text in a pipe, a file or with NO_COLOR."""
    print(f"\033[1m==> {text}\033[0m" if escapes_allowed() else f"==> {text}", flush=True)


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; `signum` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, frame: Any) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def signals_stop() -> Iterator[None]:
    """Inside the block SIGINT and SIGTERM raise `Stopped` in the main thread (SIGINT
    too when the demo was started with it ignored, as a shell's background job is)."""
    previous = {sig: signal.signal(sig, _raise) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_code(exc: BaseException) -> int:
    """128 + the signal's number, as a shell reports a process a signal ended."""
    return 128 + getattr(exc, "signum", signal.SIGINT)


def stop_all(procs: Iterable[subprocess.Popen[Any] | None], grace: float = 10.0) -> None:
    """Stop every process still running: SIGCONT and SIGTERM to each, a second SIGTERM
    after half of `grace` (a supervisor then stops at once, releasing its leases), SIGKILL
    after `grace`; all reaped. A signal meanwhile skips to SIGKILL."""
    running = [p for p in procs if p is not None and p.poll() is None]
    hurry = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: hurry.set()) for sig in STOP_SIGNALS}
    try:
        for sig in (signal.SIGCONT, signal.SIGTERM):  # a stopped process cannot exit
            _send(running, sig)
        start = time.monotonic()
        resent = False
        while any(p.poll() is None for p in running) and not hurry.is_set():
            elapsed = time.monotonic() - start
            if elapsed > grace:
                break
            if not resent and elapsed > grace / 2:
                _send(running, signal.SIGTERM)
                resent = True
            hurry.wait(0.05)
        _send(running, signal.SIGKILL)
        for proc in running:
            proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _send(procs: list[subprocess.Popen[Any]], sig: int) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
