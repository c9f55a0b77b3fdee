"""OpenTelemetry job spans: the producer's trace context on the job, the supervisor's
spans for the run (`forq.supervisor.observe.tracing`), in order and with the right parents."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the test extra brings the SDK")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode  # noqa: E402

from forq import AsyncQueue  # noqa: E402
from forq.supervisor.config.load import ConfigError, load_config  # noqa: E402
from forq.supervisor.leases.calls import leasing  # noqa: E402
from forq.supervisor.observe.tracing import JobTracer  # noqa: E402
from forq.tracing import valid_traceparent  # noqa: E402
from tests.helpers import wait_job  # noqa: E402
from tests.supervisors import SupervisorProcess, write_config  # noqa: E402

OWNER = "sup-1"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _traceparent(ctx) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_a_producer_outside_a_span_adds_nothing(queue):
    assert "traceparent" not in queue.get(queue.enqueue("t.plain").id).fields


def test_job_spans_follow_the_producer_in_order(queue, spans, redis_url):
    provider, exporter = spans
    with provider.get_tracer("app").start_as_current_span("signup") as producer:
        ok = queue.enqueue("t.ok")
        bad = queue.enqueue("t.bad")

        async def enqueue_async() -> str:
            async with AsyncQueue(queue.name, url=redis_url) as aq:
                return (await aq.enqueue("t.async")).id

        from_async = asyncio.run(enqueue_async())
    expected = _traceparent(producer.get_span_context())
    for job_id in (ok.id, bad.id, from_async):
        assert queue.get(job_id).fields["traceparent"] == expected

    tracer = JobTracer(provider.get_tracer("forq"))
    leases = {lease.id: lease for lease in leasing(queue).claim(OWNER, 3, 60_000).leases}
    handed = {}
    for job_id in (ok.id, bad.id):
        lease = leases[job_id]
        handed[job_id] = tracer.started(queue.name, lease.job, lease.token, OWNER)
        assert valid_traceparent(handed[job_id])
    tracer.finished(ok.id, leases[ok.id].token, "ack", "succeeded")
    tracer.finished(bad.id, leases[bad.id].token, "fail", "dead", "ValueError: nope")
    tracer.finished(bad.id, leases[bad.id].token, "fail", "dead")  # once only

    finished = exporter.get_finished_spans()
    names = [s.name for s in finished]
    assert names == ["signup", "forq.handler t.ok", "forq.job t.ok",
                     "forq.handler t.bad", "forq.job t.bad"]
    by_name = {s.name: s for s in finished}
    for task, status in (("t.ok", StatusCode.UNSET), ("t.bad", StatusCode.ERROR)):
        job, handler = by_name[f"forq.job {task}"], by_name[f"forq.handler {task}"]
        assert job.parent.span_id == producer.get_span_context().span_id
        assert job.context.trace_id == producer.get_span_context().trace_id
        assert handler.parent.span_id == job.context.span_id
        job_id = job.attributes["forq.job.id"]
        assert handed[job_id] == _traceparent(handler.context)
        assert (job.attributes["forq.queue"], job.attributes["forq.attempt"]) == (queue.name, 1)
        assert job.status.status_code == handler.status.status_code == status
        assert job.start_time <= handler.start_time <= handler.end_time <= job.end_time
    assert [e.name for e in by_name["forq.job t.ok"].events] == ["claimed", "started", "ack"]
    assert [e.name for e in by_name["forq.job t.bad"].events] == ["claimed", "started", "fail"]
    assert by_name["forq.job t.bad"].events[-1].attributes["forq.reason"] == "ValueError: nope"
    assert by_name["forq.job t.bad"].attributes["forq.outcome"] == "dead"


def test_a_forged_traceparent_starts_a_trace_of_its_own(queue, spans):
    provider, exporter = spans
    job = queue.enqueue("t.forged")
    queue.redis.hset(queue.keys.job(job.id), "traceparent", "00-not-a-trace-01")
    (lease,) = leasing(queue).claim(OWNER, 1, 60_000).leases
    tracer = JobTracer(provider.get_tracer("forq"))
    tracer.started(queue.name, lease.job, lease.token, OWNER)
    tracer.finished(job.id, lease.token, "ack", "succeeded")
    job_span = next(s for s in exporter.get_finished_spans() if s.name == "forq.job t.forged")
    assert job_span.parent is None


def test_tracing_config_is_checked(tmp_path):
    path = tmp_path / "forq.toml"
    base = '[redis]\nurl = "redis://127.0.0.1:6379/0"\n[[queue]]\nname = "q"\nconcurrency = 1\n'
    path.write_text(base + '[tracing]\nenabled = true\nsetup = "tests.traced:configure"\n')
    assert load_config(str(path)).tracing.setup == "tests.traced:configure"
    path.write_text(base + '[tracing]\nenabled = "yes"\n')
    with pytest.raises(ConfigError, match=r"\[tracing\].enabled: expected true or false"):
        load_config(str(path))
    path.write_text(base + '[tracing]\nsetup = "no colon"\n')
    with pytest.raises(ConfigError, match=r'\[tracing\].setup: expected "module:function"'):
        load_config(str(path))


@pytest.mark.timeout(60)
def test_a_real_supervisor_traces_jobs_and_their_follow_ups(tmp_path, redis_url, queue, spans):
    provider, _ = spans
    out = tmp_path / "spans.jsonl"
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2},
                          imports=("tests.traced",),
                          extra='[tracing]\nenabled = true\nsetup = "tests.traced:configure"\n')
    with SupervisorProcess(config, env={"FORQ_TEST_SPANS": str(out)}) as sup:
        with provider.get_tracer("app").start_as_current_span("request") as producer:
            job = queue.enqueue("tests.traced")
        handed = job.wait(timeout=20)
        follow = wait_job(queue, f"{job.id}-1", ("succeeded",), context=sup.log)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    by_job = {(r["name"].split()[0], r["attributes"]["forq.job.id"]): r for r in records}
    job_span, handler = by_job["forq.job", job.id], by_job["forq.handler", job.id]
    producer_id = f"0x{producer.get_span_context().span_id:016x}"
    assert job_span["parent_id"] == producer_id
    assert handler["parent_id"] == job_span["context"]["span_id"]
    assert handed.split("-")[1:3] == [handler["context"]["trace_id"][2:],
                                      handler["context"]["span_id"][2:]]
    # the follow-up job joins the trace under the handler that enqueued it
    assert by_job["forq.job", follow.id]["parent_id"] == handler["context"]["span_id"]
    assert [e["name"] for e in job_span["events"]] == ["claimed", "started", "ack"]
    assert job_span["attributes"]["forq.outcome"] == "succeeded"
    assert "Traceback" not in sup.log()
    assert os.path.exists(out)


def test_tracing_off_imports_no_opentelemetry():
    """forq asks for OpenTelemetry only when [tracing] is on (redis-py itself imports it
    when installed; that is redis-py's choice): every attempt to import it is refused
    and recorded with the file that asked, and none may come from forq."""
    import subprocess
    import sys

    code = """
import sys, traceback
asked = []
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            files = [f.filename for f in traceback.extract_stack()
                     if "importlib" not in f.filename and not f.filename.startswith("<")]
            asked.append(files[-1] if files else "?")
            raise ImportError(name)
sys.meta_path.insert(0, Refuse())
import os, forq, forq.supervisor
roots = tuple(os.path.dirname(m.__file__) + os.sep for m in (forq, forq.supervisor))
from forq.payload import build_spec
from forq.supervisor import supervisor
from forq.supervisor.observe import tracing
tracing.configure(tracing.TracingConfig())
assert "traceparent" not in build_spec("t", {})
print(sorted({f for f in asked if f.startswith(roots)}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
