"""The supervisor's event loop: one selector, one timer heap, signals as events.

No threads: the supervisor forks, and a fork taken while another thread holds a
lock (logging's, the allocator's) leaves the child with that lock held forever.
Signals arrive through ``signal.set_wakeup_fd`` on a socket pair, so a SIGTERM
wakes `select()` at once and is handled between events, never inside one.
"""

from __future__ import annotations

import selectors
import signal
import socket
from collections.abc import Callable, Iterable
from typing import Any

from forq.supervisor.loop.timers import Timers

Handler = Callable[[Any, int], None]


class EventLoop:
    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.timers = Timers()
        self._signal_r, self._signal_w = socket.socketpair()
        self._signal_r.setblocking(False)
        self._signal_w.setblocking(False)
        self._on_signal: Callable[[int], None] | None = None
        self._previous: dict[int, Any] = {}

    def add_reader(self, fileobj: Any, handler: Handler) -> None:
        self.selector.register(fileobj, selectors.EVENT_READ, handler)

    def remove_reader(self, fileobj: Any) -> None:
        try:
            self.selector.unregister(fileobj)
        except (KeyError, ValueError):
            pass

    def watch_signals(self, signals: Iterable[int], on_signal: Callable[[int], None]) -> None:
        """Deliver `signals` to `on_signal` from the loop, one call per signal."""
        self._on_signal = on_signal
        signal.set_wakeup_fd(self._signal_w.fileno(), warn_on_full_buffer=False)
        for sig in signals:
            # the Python-level handler does nothing: the wakeup fd carries the number
            self._previous[sig] = signal.signal(sig, lambda *_: None)
        self.add_reader(self._signal_r, self._drain_signals)

    def _drain_signals(self, sock: socket.socket, _mask: int) -> None:
        try:
            data = sock.recv(512)
        except BlockingIOError:
            return
        for signum in data:
            if self._on_signal is not None:
                self._on_signal(signum)

    def run_once(self, cap: float = 1.0) -> None:
        """Wait for the next event or timer (at most `cap` seconds) and run it."""
        for key, mask in self.selector.select(self.timers.timeout(cap)):
            key.data(key.fileobj, mask)
        self.timers.run_due()

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self.remove_reader(self._signal_r)
        self._signal_r.close()
        self._signal_w.close()
        self.selector.close()
