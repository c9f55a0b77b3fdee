"""W3C trace context on jobs: the producer's side (OpenTelemetry, optional).

A job carries the ``traceparent`` of the span that enqueued it, so its run (recorded by
the supervisor, see `forq.supervisor.tracing`) joins the producer's trace. forq never
imports OpenTelemetry for this: a producer whose process already uses it (the module
is imported, so a tracer provider may be set) gets the current span's context
injected; any other producer pays one dict lookup per job. Install ``forq[otel]``.
"""

from __future__ import annotations

import re
import sys

# version 00: trace id (32 hex, not all zero), span id (16 hex, not all zero), flags
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")


def valid_traceparent(value: object) -> bool:
    """Whether `value` is a version-00 W3C traceparent (a job's field is untrusted)."""
    return isinstance(value, str) and _TRACEPARENT.fullmatch(value) is not None


def current_traceparent() -> str | None:
    """The traceparent of the calling code's current span, when the process uses
    OpenTelemetry and a span is active; else None."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    value = carrier.get("traceparent")
    return value if valid_traceparent(value) else None
