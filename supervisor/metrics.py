"""Prometheus metrics for the supervisor parent, and a selector-driven HTTP endpoint.

Why a private :class:`~prometheus_client.CollectorRegistry`: the global
registry is shared with whatever a job handler module imports at preload
time; a handler registering its own metrics there would either collide with
ours or leak into our scrape. Children never touch this registry at all
(their counts would die with the child); the parent records everything
through :class:`Metrics` when it learns what a child did.

Why :class:`MetricsServer` is not ``prometheus_client.start_http_server``:
that runs a thread, and the supervisor forks one child per job. Forking a
process that has other threads is how you inherit a lock held by a thread
that no longer exists, so the supervisor stays single-threaded and serves
``/metrics`` from its own ``selectors`` loop instead. Every socket here is
non-blocking, so a slow or malicious client can hold a connection slot but
never stall lease keeping.

Queue depths are not tracked incrementally (other supervisors and producers
change them too); they are read from Redis at scrape time through the
``depth_reader`` callable, see :class:`Metrics`.
"""

from __future__ import annotations

import logging
import selectors
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

__all__ = [
    "DEPTH_STATES",
    "DURATION_BUCKETS",
    "OUTCOMES",
    "RSS_BUCKETS",
    "ReadyCallback",
    "WAIT_BUCKETS",
    "DepthReader",
    "Metrics",
    "MetricsServer",
]

log = logging.getLogger(__name__)

#: Every way a job attempt can end, as seen by the parent. Anything else is a
#: programming error in the supervisor and is rejected (unbounded label values
#: are how a metrics endpoint eats a Prometheus server). One attempt gets
#: exactly one outcome; the most specific cause wins: a child killed for its
#: time limit is "timeout" whether or not the job will be retried.
OUTCOMES: frozenset[str] = frozenset(
    {
        "succeeded",  # handler returned, ack accepted
        "retried",  # handler raised, `fail` rescheduled the job with backoff
        "dead",  # `fail`/`reclaim` dead-lettered it (no retries left, unknown task, ...)
        "failed",  # handler raised but the follow-up state is unknown (e.g. Redis error)
        "timeout",  # killed for exceeding its time limit
        "memory",  # killed for exceeding its memory limit
        "crashed",  # died without a result (signal, os._exit, OOM killer) -> `expire`
        "lease_lost",  # fenced: the lease was no longer ours, result dropped
        "released",  # lease given back unfinished during a drain
        "cancelled",  # stopped on request
    }
)

#: The states ``forq_queue_jobs`` reports, in exposition order.
DEPTH_STATES: tuple[str, ...] = ("pending", "scheduled", "active", "dead")

#: Job run time: from a few ms (fork + trivial handler) to an hour.
DURATION_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)

#: Time from "due" to "claimed": pick-up latency is milliseconds when idle,
#: backlog can make it hours. This is the histogram the queue-age alert reads.
WAIT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
)

_MIB = 1024 * 1024
#: Peak RSS of a child's process tree: powers of two from 1 MiB to 4 GiB.
RSS_BUCKETS: tuple[float, ...] = tuple(float(_MIB * 2**i) for i in range(13))

#: ``depth_reader() -> {queue: {state: count}}``; see :class:`Metrics`.
DepthReader = Callable[[], Mapping[str, Mapping[str, int]]]


class _DepthCollector:
    """Custom collector producing ``forq_queue_jobs{queue,state}`` at scrape time.

    Why a collector rather than a Gauge refreshed on a timer: depths are
    only interesting when someone looks, and reading them at scrape time
    costs one pipelined Redis round trip per scrape instead of one per tick.
    A failing reader must never fail the scrape (that would hide all the
    other metrics exactly when Redis is in trouble), so errors drop the
    depth samples and count ``forq_redis_errors_total{op="scrape"}``.
    """

    def __init__(
        self,
        reader: DepthReader | None,
        on_error: Callable[[], None],
        cache_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        self._on_error = on_error
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._cached: list[tuple[str, str, float]] | None = None
        self._cached_at = 0.0

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "forq_queue_jobs",
            "Jobs per queue and state, read from Redis at scrape time.",
            labels=["queue", "state"],
        )

    def describe(self) -> Iterable[Metric]:
        # Declares the name so the registry rejects a clashing collector,
        # without calling the reader at registration time.
        return [self._family()]

    def _read(self) -> list[tuple[str, str, float]] | None:
        now = self._clock()
        if self._cached is not None and now - self._cached_at < self._cache_seconds:
            return self._cached
        if self.reader is None:
            return None
        try:
            depths = self.reader()
            samples: list[tuple[str, str, float]] = []
            for queue in sorted(depths):
                states = depths[queue]
                ordered = [s for s in DEPTH_STATES if s in states]
                ordered += sorted(s for s in states if s not in DEPTH_STATES)
                for state in ordered:
                    samples.append((str(queue), str(state), float(states[state])))
        except Exception:  # a scrape must survive any reader failure
            log.debug("depth_reader failed; skipping forq_queue_jobs", exc_info=True)
            self._on_error()
            self._cached = None
            return None
        self._cached = samples
        self._cached_at = now
        return samples

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        samples = self._read()
        if samples:
            for queue, state, value in samples:
                family.add_metric([queue, state], value)
        yield family


class Metrics:
    """All supervisor metrics, in one private registry.

    ``depth_reader`` is called on every scrape (at most once per
    ``depth_cache_seconds`` when that is > 0) and must return
    ``{queue: {state: count}}`` for the states in :data:`DEPTH_STATES`.
    It runs inside the supervisor's event loop, so it should cost one
    pipelined Redis round trip and use a short socket timeout. If it
    raises, the scrape still succeeds without ``forq_queue_jobs`` samples
    and ``forq_redis_errors_total{op="scrape"}`` goes up. It can also be
    set later via :attr:`depth_reader` (the Redis client may be built after
    the metrics).
    """

    def __init__(
        self,
        depth_reader: DepthReader | None = None,
        *,
        name: str = "forq",
        version: str | None = None,
        depth_cache_seconds: float = 0.0,
        process_metrics: bool = True,
    ) -> None:
        """Create the registry and every metric.

        ``name`` and ``version`` label ``forq_supervisor_info``; ``name`` is
        the supervisor's configured name (the systemd instance, say), so
        dashboards can tell machines' configs apart. ``process_metrics``
        adds the standard ``process_*`` metrics of the parent (its RSS is
        worth watching: fork cost grows with it).
        """
        self.registry = CollectorRegistry()
        r = self.registry

        # Registered first so that a reader failure is already counted in
        # forq_redis_errors_total within the same scrape.
        self._depth = _DepthCollector(
            depth_reader, lambda: self.redis_error("scrape"), depth_cache_seconds
        )
        r.register(self._depth)

        self.jobs_started = Counter(
            "forq_jobs_started_total",
            "Job attempts started (children forked), by queue and task.",
            ["queue", "task"],
            registry=r,
        )
        self.jobs_finished = Counter(
            "forq_jobs_finished_total",
            "Job attempts finished, by queue, task and outcome.",
            ["queue", "task", "outcome"],
            registry=r,
        )
        self.job_duration = Histogram(
            "forq_job_duration_seconds",
            "Wall time of a job attempt, from fork to child exit.",
            ["queue", "task"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.job_wait = Histogram(
            "forq_job_wait_seconds",
            "Time a job waited between becoming due and being claimed.",
            ["queue"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.child_peak_rss = Histogram(
            "forq_child_peak_rss_bytes",
            "Peak resident memory of a job child's process tree.",
            ["queue", "task"],
            buckets=RSS_BUCKETS,
            registry=r,
        )
        self.children_running = Gauge(
            "forq_children_running",
            "Job children currently running on this supervisor.",
            ["queue"],
            registry=r,
        )
        self.slots = Gauge(
            "forq_slots",
            "Configured concurrency (child slots) per queue on this supervisor.",
            ["queue"],
            registry=r,
        )
        self.lease_extensions = Counter(
            "forq_lease_extensions_total",
            "Leases successfully extended by the lease keeper.",
            registry=r,
        )
        self.reclaimed_jobs = Counter(
            "forq_reclaimed_total",
            "Expired leases reclaimed by this supervisor's reaper.",
            ["queue"],
            registry=r,
        )
        self.redis_errors = Counter(
            "forq_redis_errors_total",
            "Redis operations that failed, by operation.",
            ["op"],
            registry=r,
        )
        self.info = Gauge(
            "forq_supervisor_info",
            "Always 1; labels identify the supervisor config and forq version.",
            ["name", "version"],
            registry=r,
        )
        self.info.labels(name=name, version=version or _forq_version()).set(1)
        if process_metrics:
            ProcessCollector(registry=r)

    # -- configuration ---------------------------------------------------

    @property
    def depth_reader(self) -> DepthReader | None:
        """The callable feeding ``forq_queue_jobs`` (None: no depth samples)."""
        return self._depth.reader

    @depth_reader.setter
    def depth_reader(self, reader: DepthReader | None) -> None:
        self._depth.reader = reader

    def declare_queue(self, queue: str, slots: int) -> None:
        """Publish a queue at start-up: slots set, zero children, zero reclaims.

        Why: a series that does not exist yet makes ``rate()`` and
        ``absent()`` lie until the first event; declaring the queue makes
        every per-queue panel and alert work from the first scrape.
        """
        self.slots.labels(queue=queue).set(slots)
        self.children_running.labels(queue=queue).set(0)
        self.reclaimed_jobs.labels(queue=queue)

    # -- events the supervisor reports -------------------------------------

    def job_started(self, queue: str, task: str, wait_seconds: float | None) -> None:
        """A child was forked for a claimed job that waited ``wait_seconds``.

        ``wait_seconds`` is "claimed at" minus "due at" (both Redis ``TIME``);
        None skips the wait histogram (e.g. unknown due time). Negative
        values (clock skew) are clamped to 0.
        """
        self.jobs_started.labels(queue=queue, task=task).inc()
        if wait_seconds is not None:
            self.job_wait.labels(queue=queue).observe(max(0.0, wait_seconds))

    def job_finished(
        self,
        queue: str,
        task: str,
        outcome: str,
        duration_seconds: float | None,
        peak_rss_bytes: int | None,
    ) -> None:
        """A job attempt ended with ``outcome`` (one of :data:`OUTCOMES`).

        Raises ValueError for an unknown outcome: label values must stay a
        closed set, and a typo should fail tests, not invent a series.
        ``duration_seconds``/``peak_rss_bytes`` of None are not observed
        (e.g. a lease released before the child was measured).
        """
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown job outcome {outcome!r}; expected one of {sorted(OUTCOMES)}")
        self.jobs_finished.labels(queue=queue, task=task, outcome=outcome).inc()
        if duration_seconds is not None:
            self.job_duration.labels(queue=queue, task=task).observe(max(0.0, duration_seconds))
        if peak_rss_bytes is not None:
            self.child_peak_rss.labels(queue=queue, task=task).observe(max(0, peak_rss_bytes))

    def set_children(self, queue: str, running: int) -> None:
        """Number of children of ``queue`` alive right now."""
        self.children_running.labels(queue=queue).set(running)

    def set_slots(self, queue: str, n: int) -> None:
        """Configured concurrency of ``queue`` (0 while draining is a valid choice)."""
        self.slots.labels(queue=queue).set(n)

    def lease_extended(self, n: int = 1) -> None:
        """``n`` leases were extended by one batched call."""
        if n > 0:
            self.lease_extensions.inc(n)

    def reclaimed(self, queue: str, n: int = 1) -> None:
        """The reaper moved ``n`` expired leases of ``queue`` back (or to dead)."""
        child = self.reclaimed_jobs.labels(queue=queue)
        if n > 0:
            child.inc(n)

    def redis_error(self, op: str) -> None:
        """A Redis call for operation ``op`` failed (claim, extend, ack, reclaim, scrape, ...)."""
        self.redis_errors.labels(op=op).inc()

    # -- exposition ----------------------------------------------------------

    def render(self) -> bytes:
        """The text exposition of the registry, exactly what ``GET /metrics`` returns."""
        return generate_latest(self.registry)


def _forq_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - stdlib since 3.8
        return "unknown"
    try:
        return version("forq")
    except PackageNotFoundError:
        return "unknown"


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
