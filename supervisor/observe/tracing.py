"""Job spans for OpenTelemetry ([tracing] in the config; ``pip install 'forq[otel]'``).

Per job run, the supervisor records two spans, both in the trace of the producer that
enqueued the job (its ``traceparent``, see `forq.tracing`):

* ``forq.job <task>`` (CONSUMER), a child of the producer's span, from the claim to the
  report, with events ``claimed``, ``started`` and the report (``ack``, ``fail``,
  ``expire``, ``release``, ``drop``) and the attributes job id, queue, attempt, outcome;
* ``forq.handler <task>``, its child, the handler's run in its forked child (fork to
  exit). Its context is handed to the child (``current().traceparent``), so follow-up
  jobs join the trace under it and handler code may parent spans of its own to it.

The parent records the handler's span on the child's behalf: a child `_exit`s (or is
SIGKILLed) without flushing an exporter, and must not hold a connection of its own.
Spans go to the tracer provider the process has: the one `[tracing].setup`
("module:function") installs, else the global one (``opentelemetry-instrument``).

Off (the default), `TRACER` is a `NoTracer`: nothing imports OpenTelemetry and each
job costs two calls that return at once.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from forq.supervisor.config import fields as read
from forq.supervisor.config.schema import key
from forq.tracing import valid_traceparent

log = logging.getLogger("forq.supervisor")

_SETUP_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")


def _enabled(value: object, where: str) -> bool:
    enabled = read.boolean(value, where)
    if enabled and importlib.util.find_spec("opentelemetry") is None:
        raise read.Invalid(f"{where}: OpenTelemetry is not installed (pip install 'forq[otel]')")
    return enabled


def _setup(value: object, where: str) -> str:
    if value != "" and not (isinstance(value, str) and _SETUP_RE.fullmatch(value)):
        raise read.expected(where, '"module:function"', value)
    return str(value)


@dataclass(frozen=True)
class TracingConfig:
    """`[tracing]`: each field is the row of its key (supervisor/config/schema.py)."""

    enabled: bool = key(False, read.Reader("true or false", _enabled),
                        "Spans per job run, in the producer's trace (needs `forq[otel]`).")
    setup: str = key("", read.Reader('"module:function"', _setup),
                     'Called once at start to install a tracer provider (unset: the global one).')


class NoTracer:
    """Tracing off."""

    def started(self, queue: str, job: Any, token: str, owner: str) -> str:
        return ""

    def finished(self, job_id: str, token: str, event: str, outcome: str | None,
                 reason: str = "") -> None:
        pass


class JobTracer(NoTracer):
    """Open spans per (job id, lease token): a newer lease of the same job is another run."""

    def __init__(self, tracer: Any) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace = trace
        self.tracer = tracer
        self.propagator = TraceContextTextMapPropagator()
        self.open: dict[tuple[str, str], tuple[Any, Any]] = {}

    def started(self, queue: str, job: Any, token: str, owner: str) -> str:
        """Open the job's spans as its child starts; returns the handler span's
        traceparent for the child."""
        producer = job.fields.get("traceparent")
        parent = (self.propagator.extract({"traceparent": producer})
                  if valid_traceparent(producer) else None)  # a job's field is untrusted
        attributes = {"messaging.system": "forq", "messaging.destination.name": queue,
                      "forq.job.id": job.id, "forq.queue": queue, "forq.task": job.task,
                      "forq.attempt": job.attempts + 1, "forq.crashes": job.crashes,
                      "forq.supervisor": owner}
        job_span = self.tracer.start_span(f"forq.job {job.task}", context=parent,
                                          kind=self.trace.SpanKind.CONSUMER,
                                          attributes=attributes)
        job_span.add_event("claimed", {"forq.lease.owner": owner})
        handler = self.tracer.start_span(f"forq.handler {job.task}",
                                         context=self.trace.set_span_in_context(job_span),
                                         attributes={"forq.job.id": job.id})
        job_span.add_event("started")
        self.open[(job.id, token)] = (job_span, handler)
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=self.trace.set_span_in_context(handler))
        return carrier.get("traceparent", "")

    def finished(self, job_id: str, token: str, event: str, outcome: str | None,
                 reason: str = "") -> None:
        """Close the run's spans once Redis answered its report (`event` is the
        transition, `outcome` what it meant: succeeded, retried, dead, crashed, ...)."""
        spans = self.open.pop((job_id, token), None)
        if spans is None:
            return
        job_span, handler = spans
        error = outcome not in ("succeeded", "released", None)
        now = time.time_ns()
        if error:
            status = self.trace.Status(self.trace.StatusCode.ERROR, reason or outcome)
            handler.set_status(status)
            job_span.set_status(status)
        handler.end(end_time=now)
        details = {"forq.reason": reason} if reason else {}
        job_span.add_event(event, details, timestamp=now)
        job_span.set_attribute("forq.outcome", outcome or "report failed")
        job_span.end(end_time=now)


TRACER: NoTracer = NoTracer()


class TracingUnavailable(Exception):
    """[tracing] is enabled, but OpenTelemetry (or the setup function) is not there."""


def configure(config: TracingConfig) -> NoTracer:
    """Install the process's tracer for `config` (at start and on reload)."""
    global TRACER
    if not config.enabled:
        TRACER = NoTracer()
        return TRACER
    try:
        from opentelemetry import trace
    except ImportError:
        raise TracingUnavailable("[tracing].enabled needs OpenTelemetry: "
                                 "pip install 'forq[otel]'") from None
    if config.setup and not isinstance(TRACER, JobTracer):
        module, _, function = config.setup.partition(":")
        try:
            getattr(importlib.import_module(module), function)()
        except Exception as exc:  # noqa: BLE001 — the user's code: say which and why
            raise TracingUnavailable(f"[tracing].setup {config.setup!r} failed: "
                                     f"{type(exc).__name__}: {exc}") from None
    TRACER = JobTracer(trace.get_tracer("forq"))
    return TRACER
