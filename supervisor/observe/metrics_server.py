"""The supervisor's HTTP endpoint for ``/metrics``, served from its own event loop.

Why not ``prometheus_client.start_http_server``: that runs a thread, and the
supervisor forks one child per job. Forking a process that has other threads is
how you inherit a lock held by a thread that no longer exists, so the supervisor
stays single-threaded and serves ``/metrics`` from its own ``selectors`` loop
instead. Every socket here is non-blocking, so a slow or malicious client can hold
a connection slot but never stall lease keeping.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from forq.supervisor.observe.metrics import Metrics

__all__ = ["MetricsServer", "ReadyCallback"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# HTTP endpoint
# ---------------------------------------------------------------------------

#: Handler convention for every selector registration made here: the loop
#: calls ``key.data(key.fileobj, mask)``.
ReadyCallback = Callable[[Any, int], None]


class _Conn:
    """One client connection: buffer the request, then flush the response."""

    __slots__ = ("sock", "peer", "inbuf", "outbuf", "deadline", "state")

    def __init__(self, sock: socket.socket, peer: Any, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.outbuf = memoryview(b"")
        self.deadline = deadline
        #: "reading" the request -> "writing" the response -> "closing": our
        #: side is shut down and we discard input until the client closes.
        self.state = "reading"


class MetricsServer:
    """A minimal, non-blocking, single-threaded HTTP server for ``/metrics``.

    Selector convention: every socket this server registers (the listener
    and each accepted connection) carries ``data=`` a callable, and the
    event loop must dispatch readiness as::

        for key, mask in selector.select(timeout):
            key.data(key.fileobj, mask)

    Nothing here ever blocks: requests are read as they arrive (capped at
    :attr:`max_request_bytes`), responses are written as the socket accepts
    them. A connection that has not finished within :attr:`timeout` seconds
    is dropped; stale connections are swept on every event and by
    :meth:`sweep`, which the loop may call on its timer tick. At most
    :attr:`max_connections` are open at once (the oldest is dropped to make
    room), so a client that never sends cannot pin resources.

    Routes: ``GET``/``HEAD /metrics`` → 200 with the registry in the text
    format (``CONTENT_TYPE_LATEST``); any other path → 404; other methods →
    405; malformed or oversized requests → 400/431.
    """

    max_request_bytes = 8192
    max_connections = 16

    def __init__(
        self,
        metrics: Metrics,
        host: str = "127.0.0.1",
        port: int = 9464,
        *,
        timeout: float = 2.0,
        backlog: int = 16,
    ) -> None:
        """Bind and listen (non-blocking) on ``host:port``; port 0 picks a free one.

        Defaults to loopback: the endpoint is unauthenticated, so exposing it
        beyond the host must be an explicit choice.
        """
        self.metrics = metrics
        self.timeout = timeout
        self._selector: selectors.BaseSelector | None = None
        self._conns: dict[int, _Conn] = {}
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, socktype, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, socktype, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                # "::" should also accept IPv4, as users expect of a wildcard.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(sockaddr)
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock: socket.socket | None = sock
        bound = sock.getsockname()
        #: ``(host, port)`` actually bound; with port 0 this is the chosen port.
        self.address: tuple[str, int] = (str(bound[0]), int(bound[1]))

    # -- selector integration ------------------------------------------------

    @property
    def listener(self) -> socket.socket | None:
        """The listening socket (None once closed)."""
        return self._sock

    def fileno(self) -> int:
        """The listening socket's fd (so the server itself can be selected on)."""
        if self._sock is None:
            return -1
        return self._sock.fileno()

    def register(self, selector: selectors.BaseSelector) -> None:
        """Register the listener with ``selector`` (``data=self.handle_ready``).

        The selector is remembered: accepted connections are registered on
        it too, with their own callbacks, and unregistered when done.
        """
        if self._sock is None:
            raise RuntimeError("MetricsServer is closed")
        self._selector = selector
        selector.register(self._sock, selectors.EVENT_READ, self.handle_ready)

    def handle_ready(self, fileobj: Any, mask: int) -> None:
        """Listener readiness: accept every pending connection."""
        if self._sock is None or self._selector is None:
            return
        self.sweep()
        while True:
            try:
                conn, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE, ECONNABORTED: try again next event
                log.debug("metrics accept failed: %s", exc)
                return
            conn.setblocking(False)
            if len(self._conns) >= self.max_connections:
                oldest = min(self._conns.values(), key=lambda c: c.deadline)
                self._drop(oldest)
            state = _Conn(conn, peer, time.monotonic() + self.timeout)
            self._conns[conn.fileno()] = state
            self._selector.register(
                conn, selectors.EVENT_READ, lambda f, m, s=state: self._on_conn(s, m)
            )

    def sweep(self, now: float | None = None) -> int:
        """Drop connections past their deadline; return how many were dropped."""
        now = time.monotonic() if now is None else now
        stale = [c for c in self._conns.values() if c.deadline <= now]
        for conn in stale:
            log.debug("metrics connection from %s timed out", conn.peer)
            self._drop(conn)
        return len(stale)

    # -- per-connection state machine ------------------------------------------

    def _on_conn(self, conn: _Conn, mask: int) -> None:
        self.sweep()
        if self._conns.get(conn.sock.fileno()) is not conn:
            return  # timed out just now
        try:
            if conn.state == "reading":
                self._read(conn)
            elif conn.state == "writing":
                self._flush(conn)
            else:
                self._linger(conn)
        except OSError as exc:
            log.debug("metrics connection from %s failed: %s", conn.peer, exc)
            self._drop(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        if not chunk:
            self._drop(conn)
            return
        conn.inbuf += chunk
        end = conn.inbuf.find(b"\r\n\r\n")
        if end < 0:
            end = conn.inbuf.find(b"\n\n")
        if end < 0:
            if len(conn.inbuf) > self.max_request_bytes:
                self._respond(conn, 431, "text/plain; charset=utf-8", b"request too large\n")
            return
        self._dispatch(conn, bytes(conn.inbuf[:end]))

    def _dispatch(self, conn: _Conn, head: bytes) -> None:
        request_line = head.split(b"\n", 1)[0].strip()
        parts = request_line.split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            self._respond(conn, 400, "text/plain; charset=utf-8", b"bad request\n")
            return
        method, target = parts[0], parts[1]
        path = target.split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            self._respond(
                conn, 405, "text/plain; charset=utf-8", b"method not allowed\n",
                extra=b"Allow: GET, HEAD\r\n",
            )
            return
        if path != b"/metrics":
            self._respond(conn, 404, "text/plain; charset=utf-8", b"not found; try /metrics\n",
                          head_only=method == b"HEAD")
            return
        try:
            body = self.metrics.render()
        except Exception:  # never let a collector bug kill the loop
            log.exception("rendering metrics failed")
            self._respond(conn, 500, "text/plain; charset=utf-8", b"metrics collection failed\n")
            return
        self._respond(conn, 200, CONTENT_TYPE_LATEST, body, head_only=method == b"HEAD")

    def _respond(
        self,
        conn: _Conn,
        status: int,
        content_type: str,
        body: bytes,
        *,
        extra: bytes = b"",
        head_only: bool = False,
    ) -> None:
        reason = _REASONS.get(status, "Unknown")
        head = (
            f"HTTP/1.1 {status} {reason}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n"
        ).encode("latin-1") + extra + b"\r\n"
        conn.outbuf = memoryview(head if head_only else head + body)
        conn.inbuf = bytearray()
        conn.state = "writing"
        # Give the client the full timeout again to read a large response.
        conn.deadline = time.monotonic() + self.timeout
        assert self._selector is not None
        self._selector.modify(
            conn.sock, selectors.EVENT_WRITE, lambda f, m, s=conn: self._on_conn(s, m)
        )
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        while conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                return  # wait for EVENT_WRITE
            conn.outbuf = conn.outbuf[sent:]
        # Response handed to the kernel. Closing now, with unread request
        # bytes still queued (an oversized request, a pipelined one), would
        # make the kernel send RST and the client could lose the response.
        # So half-close and discard input until the client closes or the
        # deadline passes: the usual "lingering close" of HTTP servers.
        conn.sock.shutdown(socket.SHUT_WR)
        conn.state = "closing"
        assert self._selector is not None
        self._selector.modify(
            conn.sock, selectors.EVENT_READ, lambda f, m, s=conn: self._on_conn(s, m)
        )

    def _linger(self, conn: _Conn) -> None:
        # One recv per event, like _read: a client flooding us cannot keep
        # the loop here, and the deadline ends the connection regardless.
        try:
            chunk = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        if not chunk:
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd >= 0:
            self._conns.pop(fd, None)
            if self._selector is not None:
                try:
                    self._selector.unregister(conn.sock)
                except (KeyError, ValueError):
                    pass
        conn.outbuf = memoryview(b"")
        try:
            conn.sock.close()
        except OSError:  # pragma: no cover
            pass

    # -- lifecycle -------------------------------------------------------------

    @property
    def open_connections(self) -> int:
        """Client connections currently open (for tests and debugging)."""
        return len(self._conns)

    @classmethod
    def serving(cls, metrics: Metrics, listen: tuple[str, int] | None,
                selector: selectors.BaseSelector) -> MetricsServer | None:
        """A server on `listen` ([metrics].listen), registered with the supervisor's
        `selector`; None when metrics are off. Raises OSError if it cannot bind."""
        if not listen:
            return None
        server = cls(metrics, *listen)
        server.register(selector)
        log.info("metrics on http://%s:%d/metrics", *server.address)
        return server

    def close(self) -> None:
        """Unregister and close the listener and every open connection. Idempotent."""
        for conn in list(self._conns.values()):
            self._drop(conn)
        if self._sock is not None:
            if self._selector is not None:
                try:
                    self._selector.unregister(self._sock)
                except (KeyError, ValueError):
                    pass
            self._sock.close()
            self._sock = None
        self._selector = None

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}
