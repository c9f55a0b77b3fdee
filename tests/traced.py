"""Handlers and the [tracing].setup hook for tests/test_tracing.py's real supervisor:
spans are written as JSON lines to $FORQ_TEST_SPANS (they come from another process,
so the SDK's in-memory exporter cannot be read from the test)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from forq import current, task


@task("tests.traced")
def traced() -> str:
    current().enqueue("tests.traced_followup")
    return current().traceparent  # what the child was handed: its handler span's context


@task("tests.traced_followup")
def traced_followup() -> str:
    return current().traceparent


def configure() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class JsonLines(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            with open(os.environ["FORQ_TEST_SPANS"], "a") as out:
                for span in spans:
                    out.write(json.dumps(json.loads(span.to_json())) + "\n")
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLines()))
    trace.set_tracer_provider(provider)
