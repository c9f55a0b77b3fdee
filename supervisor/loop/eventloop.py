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


class _ReadWrite:
    """The handlers of a file watched both ways (`add_writer` on a file read already)."""

    def __init__(self, reader: Handler, writer: Handler) -> None:
        self.reader = reader
        self.writer = writer

    def __call__(self, fileobj: Any, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            self.reader(fileobj, mask)
        if mask & selectors.EVENT_WRITE:
            self.writer(fileobj, mask)


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

    def add_writer(self, fileobj: Any, handler: Handler) -> None:
        """Call `handler` whenever `fileobj` is writable, beside its reader if it has one
        (`remove_writer` stops it; `remove_reader` stops both)."""
        try:
            key = self.selector.get_key(fileobj)
        except KeyError:
            self.selector.register(fileobj, selectors.EVENT_WRITE, handler)
            return
        if key.events & selectors.EVENT_READ:
            reader = key.data.reader if isinstance(key.data, _ReadWrite) else key.data
            self.selector.modify(fileobj, selectors.EVENT_READ | selectors.EVENT_WRITE,
                                 _ReadWrite(reader, handler))
        else:
            self.selector.modify(fileobj, selectors.EVENT_WRITE, handler)

    def remove_writer(self, fileobj: Any) -> None:
        try:
            key = self.selector.get_key(fileobj)
        except (KeyError, ValueError):
            return
        if isinstance(key.data, _ReadWrite):
            self.selector.modify(fileobj, selectors.EVENT_READ, key.data.reader)
        elif key.events == selectors.EVENT_WRITE:
            self.selector.unregister(fileobj)

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
