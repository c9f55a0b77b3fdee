"""A small TCP proxy between one supervisor and Redis, for partitions.

Killing Redis gives clean connection errors; a partition gives silence. Each chaos
supervisor reaches Redis through its own `Proxy` (127.0.0.1, a free port), which the
`partition` fault switches between:

* ``pass``: bytes flow both ways;
* ``blackhole``: connections stay open (new ones are accepted too) but nothing flows,
  no answer, no RST: what a dropped route looks like to the supervisor, whose calls
  then run into their socket timeouts;
* ``slow``: every chunk is held back `delay` seconds in each direction;
* ``cut``: every connection is reset, and new ones are reset on accept.

One thread, one selector, for every connection of the supervisor (its command pool and
its pub/sub connection). Bytes held back in a blackhole stay in the kernel's buffers and
flow when the path heals, as they would on a real network.
"""

from __future__ import annotations

import heapq
import selectors
import socket
import struct
import threading
import time

PASS, BLACKHOLE, SLOW, CUT = "pass", "blackhole", "slow", "cut"
CHUNK = 65536


class Proxy(threading.Thread):
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        super().__init__(name=f"proxy-{target_port}", daemon=True)
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.mode = PASS
        self.delay = 0.0
        self.peer: dict[socket.socket, socket.socket] = {}
        self.held: list[tuple[float, int, socket.socket, bytes]] = []  # slow mode
        self.seq = 0
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.stopped = False
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def set_mode(self, mode: str, delay: float = 0.0) -> None:
        with self.lock:
            self.mode, self.delay = mode, delay
        self.wake_w.send(b"x")

    def stop(self) -> None:
        self.stopped = True
        self.wake_w.send(b"x")

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        while not self.stopped:
            with self.lock:
                mode = self.mode
            self._watch(mode != BLACKHOLE)
            if mode == CUT:
                for sock in list(self.peer):
                    self._close(sock, reset=True)
            timeout = None
            if self.held:
                timeout = max(0.0, self.held[0][0] - time.monotonic())
            for key, _ in self.selector.select(timeout):
                sock = key.fileobj
                if sock is self.wake_r:
                    self.wake_r.recv(4096)
                elif sock is self.listener:
                    self._accept(mode)
                elif sock in self.peer:
                    self._forward(sock, mode)
            self._release_held()
        for sock in list(self.peer):
            self._close(sock)
        self.listener.close()

    def _watch(self, reading: bool) -> None:
        """Read from the connections unless blackholed (then their bytes wait in the
        kernel, and the selector does not spin on them)."""
        for sock in list(self.peer):
            registered = self._registered(sock)
            if reading and not registered:
                self.selector.register(sock, selectors.EVENT_READ)
            elif not reading and registered:
                self.selector.unregister(sock)

    def _registered(self, sock: socket.socket) -> bool:
        try:
            self.selector.get_key(sock)
            return True
        except (KeyError, ValueError):
            return False

    def _accept(self, mode: str) -> None:
        try:
            client, _ = self.listener.accept()
        except (BlockingIOError, OSError):
            return
        if mode == CUT:
            _reset(client)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=1.0)
        except OSError:
            _reset(client)  # Redis is down: the supervisor sees a refused connection
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer[client], self.peer[upstream] = upstream, client

    def _forward(self, sock: socket.socket, mode: str) -> None:
        try:
            data = sock.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(sock)
            return
        if mode == SLOW and self.delay > 0:
            self.seq += 1
            heapq.heappush(self.held, (time.monotonic() + self.delay, self.seq,
                                       self.peer[sock], data))
            return
        self._send(self.peer[sock], data)

    def _release_held(self) -> None:
        now = time.monotonic()
        while self.held and self.held[0][0] <= now:
            _, _, target, data = heapq.heappop(self.held)
            if target in self.peer:
                self._send(target, data)

    def _send(self, target: socket.socket, data: bytes) -> None:
        try:
            target.setblocking(True)
            target.settimeout(2.0)
            target.sendall(data)
            target.setblocking(False)
        except OSError:
            self._close(target)

    def _close(self, sock: socket.socket, reset: bool = False) -> None:
        other = self.peer.pop(sock, None)
        for s in (sock, other):
            if s is None:
                continue
            self.peer.pop(s, None)
            if self._registered(s):
                self.selector.unregister(s)
            if reset:
                _reset(s)
            else:
                s.close()


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a cut path or a refusing peer does."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()
