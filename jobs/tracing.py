"""W3C trace context on jobs: the producer's side (OpenTelemetry, optional).

A job carries the ``traceparent`` of the span that enqueued it, so its run (recorded by
the supervisor, see `forq.supervisor.observe.tracing`) joins the producer's trace. forq never
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
    OpenTelemetry and a valid span is active; else None. Called for every job built, so
    it reads the span context directly (a propagator costs ~20 times more), and asks
    nothing of a process without OpenTelemetry."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
