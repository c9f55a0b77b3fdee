"""The real MetricsServer, driven by a selectors loop, scraped over real HTTP."""

from __future__ import annotations

import os
import selectors
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from forq.supervisor.observe.metrics import OUTCOMES, RSS_BUCKETS, Metrics
from forq.supervisor.observe.metrics_server import MetricsServer
from tests.helpers import wait_for

MIB = 1024 * 1024


@dataclass
class Loop:
    """The supervisor's dispatch convention, run in a thread for the test.

    The server itself is single-threaded; the thread only stands in for the
    supervisor's main loop so the HTTP client can block in the test body.
    """

    server: MetricsServer
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for key, mask in self.selector.select(timeout=0.02):
                    key.data(key.fileobj, mask)
                self.server.sweep()
        except BaseException as exc:  # surfaced by the fixture
            self.errors.append(exc)


@pytest.fixture
def serve() -> Iterator[Callable[..., Loop]]:
    started: list[tuple[Loop, threading.Thread]] = []

    def start(metrics: Metrics, **kwargs: object) -> Loop:
        server = MetricsServer(metrics, "127.0.0.1", 0, **kwargs)  # type: ignore[arg-type]
        loop = Loop(server)
        server.register(loop.selector)
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        started.append((loop, thread))
        return loop

    yield start
    for loop, thread in started:
        loop.stop.set()
        thread.join(5)
        loop.server.close()
        assert loop.server.open_connections == 0
        assert not loop.selector.get_map(), "server must unregister everything on close"
        loop.selector.close()
        assert not loop.errors, loop.errors


def url(loop: Loop, path: str = "/metrics") -> str:
    host, port = loop.server.address
    return f"http://{host}:{port}{path}"


def scrape(loop: Loop) -> str:
    with urllib.request.urlopen(url(loop), timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == CONTENT_TYPE_LATEST
        return resp.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(parsed: Mapping, metric: str, /, **labels: str) -> float:
    return parsed[(metric, frozenset(labels.items()))]


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is required in CI but not installed")
        pytest.skip("promtool not installed (set CI=1 to make this a failure)")
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr


DEPTHS = {
    "emails": {"pending": 7, "scheduled": 2, "active": 1, "dead": 3},
    "reports": {"pending": 0, "scheduled": 0, "active": 0, "dead": 0},
}


def record_known_work(m: Metrics) -> None:
    m.declare_queue("emails", 4)
    m.declare_queue("reports", 1)
    m.job_started("emails", "send", 0.02)
    m.job_started("emails", "send", 0.3)
    m.job_started("emails", "send", -1.0)  # clock skew clamps to 0
    m.job_started("reports", "build", None)
    m.job_finished("emails", "send", "succeeded", 1.5, 3 * MIB)
    m.job_finished("emails", "send", "retried", 0.2, 100 * MIB)
    m.job_finished("emails", "send", "crashed", 4.0, None)
    m.job_finished("reports", "build", "timeout", None, 5 * 1024 * MIB)
    m.set_children("emails", 1)
    m.set_slots("reports", 2)
    m.lease_extended(5)
    m.lease_extended(3)
    m.lease_extended(0)
    m.reclaimed("emails", 2)
    m.redis_error("claim")
    m.redis_error("claim")
    m.redis_error("extend")


def test_scrape_reports_exact_values(serve: Callable[..., Loop]) -> None:
    calls = []

    def depth_reader() -> dict[str, dict[str, int]]:
        calls.append(1)
        return DEPTHS

    m = Metrics(depth_reader, name="test", version="9.9.9")
    record_known_work(m)
    loop = serve(m)
    text = scrape(loop)
    p = samples(text)

    assert value(p, "forq_jobs_started_total", queue="emails", task="send") == 3
    assert value(p, "forq_jobs_started_total", queue="reports", task="build") == 1
    assert value(p, "forq_jobs_finished_total", queue="emails", task="send", outcome="succeeded") == 1
    assert value(p, "forq_jobs_finished_total", queue="emails", task="send", outcome="retried") == 1
    assert value(p, "forq_jobs_finished_total", queue="emails", task="send", outcome="crashed") == 1
    assert value(p, "forq_jobs_finished_total", queue="reports", task="build", outcome="timeout") == 1

    # Durations: 1.5 + 0.2 + 4.0 for emails; the None duration was not observed.
    assert value(p, "forq_job_duration_seconds_count", queue="emails", task="send") == 3
    assert value(p, "forq_job_duration_seconds_sum", queue="emails", task="send") == pytest.approx(5.7)
    assert value(p, "forq_job_duration_seconds_bucket", queue="emails", task="send", le="1.0") == 1
    assert value(p, "forq_job_duration_seconds_bucket", queue="emails", task="send", le="5.0") == 3
    assert ("forq_job_duration_seconds_count", frozenset({("queue", "reports"), ("task", "build")})) not in p

    # Waits: 0.02, 0.3 and a clamped 0.0; the None wait was not observed.
    assert value(p, "forq_job_wait_seconds_count", queue="emails") == 3
    assert value(p, "forq_job_wait_seconds_sum", queue="emails") == pytest.approx(0.32)
    assert value(p, "forq_job_wait_seconds_bucket", queue="emails", le="0.001") == 1
    assert value(p, "forq_job_wait_seconds_bucket", queue="emails", le="0.025") == 2
    assert value(p, "forq_job_wait_seconds_bucket", queue="emails", le="0.5") == 3

    # Peak RSS: 3 MiB and 100 MiB for emails; 5 GiB lands only in +Inf.
    rss = "forq_child_peak_rss_bytes_bucket"
    assert value(p, rss, queue="emails", task="send", le=floatToGoString(4 * MIB)) == 1
    assert value(p, rss, queue="emails", task="send", le=floatToGoString(128 * MIB)) == 2
    assert value(p, "forq_child_peak_rss_bytes_count", queue="emails", task="send") == 2
    assert value(p, rss, queue="reports", task="build", le=floatToGoString(4096 * MIB)) == 0
    assert value(p, rss, queue="reports", task="build", le="+Inf") == 1
    assert RSS_BUCKETS[0] == MIB and RSS_BUCKETS[-1] == 4096 * MIB

    assert value(p, "forq_children_running", queue="emails") == 1
    assert value(p, "forq_children_running", queue="reports") == 0
    assert value(p, "forq_slots", queue="emails") == 4
    assert value(p, "forq_slots", queue="reports") == 2
    assert value(p, "forq_lease_extensions_total") == 8
    assert value(p, "forq_reclaimed_total", queue="emails") == 2
    assert value(p, "forq_reclaimed_total", queue="reports") == 0  # declared at zero
    assert value(p, "forq_redis_errors_total", op="claim") == 2
    assert value(p, "forq_redis_errors_total", op="extend") == 1
    assert ("forq_redis_errors_total", frozenset({("op", "scrape")})) not in p
    assert value(p, "forq_supervisor_info", name="test", version="9.9.9") == 1

    # Depth collector samples, straight from depth_reader at scrape time.
    for queue, states in DEPTHS.items():
        for state, n in states.items():
            assert value(p, "forq_queue_jobs", queue=queue, state=state) == n
    assert len(calls) == 1
    # And the raw text carries them as the exposition format spells them.
    assert 'forq_queue_jobs{queue="emails",state="dead"} 3.0' in text
    assert "# TYPE forq_queue_jobs gauge" in text
    assert "forq_lease_extensions_total 8.0" in text

    # Read at scrape time: a change in Redis shows on the next scrape.
    DEPTHS_LATER = {"emails": {"pending": 8, "scheduled": 2, "active": 1, "dead": 3}}
    m.depth_reader = lambda: DEPTHS_LATER
    p2 = samples(scrape(loop))
    assert value(p2, "forq_queue_jobs", queue="emails", state="pending") == 8
    assert ("forq_queue_jobs", frozenset({("queue", "reports"), ("state", "pending")})) not in p2

    promtool_check(text)


def test_raising_depth_reader_does_not_break_scrape(serve: Callable[..., Loop]) -> None:
    def broken() -> dict[str, dict[str, int]]:
        raise ConnectionError("redis is down")

    m = Metrics(broken)
    record_known_work(m)
    loop = serve(m)
    text = scrape(loop)
    p = samples(text)
    assert not [k for k in p if k[0] == "forq_queue_jobs"]
    assert value(p, "forq_redis_errors_total", op="scrape") == 1
    # Everything else is still there.
    assert value(p, "forq_jobs_started_total", queue="emails", task="send") == 3
    assert value(p, "forq_slots", queue="emails") == 4
    p = samples(scrape(loop))
    assert value(p, "forq_redis_errors_total", op="scrape") == 2
    promtool_check(text)


def test_no_depth_reader_and_empty_metrics_are_valid(serve: Callable[..., Loop]) -> None:
    loop = serve(Metrics())
    text = scrape(loop)
    assert "# TYPE forq_queue_jobs gauge" in text
    assert "forq_queue_jobs{" not in text
    promtool_check(text)


def test_depth_cache_limits_redis_reads(serve: Callable[..., Loop]) -> None:
    calls = []

    def reader() -> dict[str, dict[str, int]]:
        calls.append(1)
        return DEPTHS

    loop = serve(Metrics(reader, depth_cache_seconds=60))
    scrape(loop)
    scrape(loop)
    assert len(calls) == 1


def test_unknown_outcome_is_rejected() -> None:
    m = Metrics()
    with pytest.raises(ValueError, match="unknown job outcome"):
        m.job_finished("q", "t", "exploded", 1.0, None)
    assert OUTCOMES == {
        "succeeded", "failed", "retried", "dead", "timeout", "memory",
        "crashed", "lease_lost", "released", "cancelled", "snoozed", "throttled",
    }


def test_private_registry() -> None:
    from prometheus_client import REGISTRY

    Metrics()
    Metrics()  # a second instance must not clash with the first
    assert "forq_jobs_started_total" not in {
        s.name for fam in REGISTRY.collect() for s in fam.samples
    }


def test_routes(serve: Callable[..., Loop]) -> None:
    loop = serve(Metrics())
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(url(loop, "/"), timeout=5)
    assert exc.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(url(loop, "/metricsx"), timeout=5)
    assert exc.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(urllib.request.Request(url(loop), data=b"x"), timeout=5)
    assert exc.value.code == 405
    head = urllib.request.Request(url(loop), method="HEAD")
    with urllib.request.urlopen(head, timeout=5) as resp:
        assert resp.status == 200
        assert int(resp.headers["Content-Length"]) > 0
        assert resp.read() == b""
    with urllib.request.urlopen(url(loop, "/metrics?name[]=forq_slots"), timeout=5) as resp:
        assert resp.status == 200


def raw_request(loop: Loop, payload: bytes) -> bytes:
    with socket.create_connection(loop.server.address, timeout=5) as s:
        s.sendall(payload)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_bad_and_oversized_requests(serve: Callable[..., Loop]) -> None:
    loop = serve(Metrics())
    assert raw_request(loop, b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    huge = b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 20000
    assert raw_request(loop, huge).startswith(b"HTTP/1.1 431 ")
    assert raw_request(loop, b"GET /metrics HTTP/1.0\n\n").startswith(b"HTTP/1.1 200 OK")


def test_slow_client_does_not_block_the_loop(serve: Callable[..., Loop]) -> None:
    m = Metrics(lambda: DEPTHS)
    loop = serve(m, timeout=0.5)
    # A client that connects and sends half a request, then stalls.
    stalled = socket.create_connection(loop.server.address, timeout=5)
    stalled.sendall(b"GET /metr")
    idle = socket.create_connection(loop.server.address, timeout=5)
    try:
        t0 = time.monotonic()
        text = scrape(loop)
        assert time.monotonic() - t0 < 0.4, "scrape waited for the stalled client"
        assert "forq_queue_jobs" in text
        # Past the timeout the stalled connections are dropped by the server.
        stalled.settimeout(3)
        assert stalled.recv(100) == b""
        idle.settimeout(3)
        assert idle.recv(100) == b""
        wait_for(lambda: loop.server.open_connections == 0, timeout=3,
                 message="the stalled connections to be dropped")
    finally:
        stalled.close()
        idle.close()


def test_connection_cap(serve: Callable[..., Loop]) -> None:
    loop = serve(Metrics(), timeout=30)
    cap = loop.server.max_connections
    hogs = [socket.create_connection(loop.server.address, timeout=5) for _ in range(cap + 4)]
    try:
        # Still served although every slot was taken by a silent client.
        scrape(loop)
        assert loop.server.open_connections <= cap
    finally:
        for s in hogs:
            s.close()


def test_large_response_is_written_without_blocking(serve: Callable[..., Loop]) -> None:
    # Many series make a response bigger than a socket buffer, exercising the
    # EVENT_WRITE path; the client reads slowly at first.
    many = {f"queue-{i:04d}": {"pending": i, "scheduled": 0, "active": 0, "dead": 0} for i in range(3000)}
    m = Metrics(lambda: many)
    loop = serve(m)
    # Small buffers on both ends (accepted sockets inherit the listener's
    # SO_SNDBUF; the client's is set before connect so it is advertised)
    # guarantee the server's send() hits EAGAIN part way.
    assert loop.server.listener is not None
    loop.server.listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
        s.settimeout(5)
        s.connect(loop.server.address)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        # The response is still pending in the server (white-box check that
        # the EVENT_WRITE path is what this test exercises)...
        wait_for(lambda: [c.state for c in list(loop.server._conns.values())] == ["writing"],
                 timeout=5, message="the response to be part-written")
        # ...and the loop is free meanwhile: another scrape is served.
        scrape(loop)
        data = bytearray()
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0].split(b":")[1])
    assert len(body) == length > 200_000
    assert b'forq_queue_jobs{queue="queue-2999",state="pending"} 2999.0' in body


def test_default_bind_is_loopback_and_close_is_idempotent() -> None:
    import inspect

    assert inspect.signature(MetricsServer).parameters["host"].default == "127.0.0.1"
    server = MetricsServer(Metrics(), port=0)
    assert server.address[0] == "127.0.0.1"
    assert server.address[1] > 0
    sel = selectors.DefaultSelector()
    server.register(sel)
    assert sel.get_key(server.listener).data == server.handle_ready
    server.close()
    server.close()
    assert not sel.get_map()
    sel.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(server.address, timeout=1).close()
