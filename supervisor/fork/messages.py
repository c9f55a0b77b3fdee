"""What a job's child may say to its parent, and how the parent reads it.

Handler code is untrusted (buggy, or written to do harm): whatever a child writes to
its result pipe is read here under a size cap and checked against a schema before the
supervisor acts on it. What fails the check is a `Violation` — the job ends as a crash
with that reason — never an exception in the supervisor, whose other jobs must not
notice. Framing: one JSON object per line (``json.dumps`` never emits a raw newline);
a stream, not datagrams: a result may be larger than a pipe's buffer. Every message
names its kind in ``"t"``:

``{"t": "result", "ok": true, "result": <any JSON>, "followups": [<job spec>, ...]}``
    the handler returned; the follow-ups are job specs built by ``current().enqueue``
    (`forq.payload.build_spec`), each checked again here by `check_followup`. Any result
    may say ``"began"``: CLOCK_MONOTONIC at the handler's first line (`children.cost`
    checks it: only its own record's start latency can be wrong).
``{"t": "result", "ok": false, "error": {"type", "message", "traceback", "reason"},
"fatal": bool}``
    the handler raised; ``fatal`` (NonRetryable, a result that cannot be stored) means
    no retry.
``"retry": {"delay_ms", "counted"}`` or ``"throttle": {"delay_ms", "group"}`` (ok false)
    the handler raised `Retry` (again after ``delay_ms``, up to `MAX_SNOOZE_MS`; an
    attempt if ``counted``) or called ``current().throttle`` (its own queue, or its own
    group: the message names neither, so no child pauses another; up to
    `MAX_THROTTLE_MS`, cut to the queue's ``max_throttle`` by the parent).
``{"t": "progress", "progress": 0.42, "message": "resized 42 of 100"}``
    ``current().progress``: a number in 0..1 and a short message (throttled by the
    child, `forq.channel`); the parent keeps the latest and records it with its next
    lease extension.
``{"t": "step", "name": "charge-card", "result": <any JSON>}``
    ``current().step``: a durable step's result. The child then waits for the parent's
    answer on the same socket (`channel` makes it a socketpair), one line
    ``{"step": name, "answer": "ok" | "lost"}``: "ok" once Redis holds the result
    (fenced by the lease token), "lost" if the lease is no longer this supervisor's.
    One step at a time: a step sent before the previous one was answered, more than
    `MAX_STEPS` per job, a name over `MAX_STEP_NAME` bytes, a result over
    `MAX_STEP_BYTES` or results over `MAX_STEPS_BYTES` in all is a violation.

``{"t": "parents"}``
    ``current().parents()``: the next page of the job's parents (never named by the
    child), answered ``{"parents": [[queue, id, state, result, reason], ...], "more":
    bool}`` or ``{"parents": null, "answer": "lost" | "expired"}``; asking before the
    whole answer was written, or after the last page, is a violation.
The result is the child's last message: anything after it is a violation.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from typing import Any

from forq.channel import (
    MAX_PROGRESS_MESSAGE,
    MAX_SNOOZE_MS,
    MAX_STEP_BYTES,
    MAX_STEP_NAME,
    MAX_THROTTLE_MS,
)
from forq.payload import check_callback, check_followup

RESULT_OVERHEAD = 64 * 1024  # the envelope and follow-ups beside the result itself
MAX_FOLLOWUPS = 1000
# an error's fields, capped where the child builds them and checked again here
ERROR_CAPS = {"type": 200, "message": 64 * 1024, "traceback": 8192, "reason": 500}
STEP_OVERHEAD = MAX_STEP_NAME * 6 + 64  # a step message's envelope, its name escaped


def channel() -> tuple[int, int]:
    """A job's channel: (the parent's end, the child's end), both blocking, neither
    inheritable. A socketpair rather than a pipe, so the parent can answer a step."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return ours.detach(), theirs.detach()


class Violation(Exception):
    """The child broke the protocol; the message says how (it ends the job as a crash)."""


@dataclass
class Report:
    """A checked result message."""

    ok: bool
    result_json: str = "null"  # compact JSON, re-encoded here: never the child's bytes
    followups: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, str] = field(default_factory=dict)
    fatal: bool = False
    # the batch the handler opened (`current().batch`), checked: id, members (specs with
    # their queue), on_success / on_complete (specs); None when it opened none
    batch: dict[str, Any] | None = None
    snooze: tuple[int, bool] | None = None  # `Retry`: (delay ms, counted as an attempt)
    throttle: tuple[int, bool] | None = None  # `throttle`: (delay ms, of its group)


@dataclass
class Progress:
    """A checked progress message."""

    value: float
    message: str


@dataclass
class Step:
    """A checked step message: its result re-encoded here (never the child's bytes)."""

    name: str
    result_json: str


def check_progress(message: dict[str, Any]) -> Progress:
    unknown = set(message) - {"t", "progress", "message"}
    if unknown:
        raise Violation(f"progress has unknown field(s) {', '.join(sorted(unknown))[:200]}")
    value = message.get("progress")
    # NaN fails both comparisons; a huge int compares without becoming a float
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise Violation(f"progress must be a number from 0 to 1, got {value!r}"[:200])
    text = message.get("message", "")
    if not isinstance(text, str):
        raise Violation(f"progress message must be a string, got {type(text).__name__}")
    if len(text) > MAX_PROGRESS_MESSAGE:
        raise Violation(f"progress message over {MAX_PROGRESS_MESSAGE} characters")
    return Progress(float(value), text)


def check_step(message: dict[str, Any]) -> Step:
    unknown = set(message) - {"t", "name", "result"}
    if unknown:
        raise Violation(f"step has unknown field(s) {', '.join(sorted(unknown))[:200]}")
    name = message.get("name")
    if not isinstance(name, str) or not name:
        raise Violation(f"step name must be a non-empty string, got {name!r}"[:200])
    if len(name.encode(errors="surrogatepass")) > MAX_STEP_NAME:
        raise Violation(f"step name over {MAX_STEP_NAME} bytes")
    if "result" not in message:
        raise Violation(f"step {name!r} has no result")
    result = json.dumps(message["result"], separators=(",", ":"), allow_nan=False)
    if len(result) > MAX_STEP_BYTES:
        raise Violation(f"step {name!r} result of {len(result)} bytes, over {MAX_STEP_BYTES}")
    return Step(name, result)


def encode(message: dict[str, Any]) -> bytes:
    """A message as the child writes it (one line)."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def _check_error(error: Any) -> dict[str, str]:
    if not isinstance(error, dict):
        raise Violation(f"error must be an object, got {type(error).__name__}")
    checked = {}
    for name, cap in ERROR_CAPS.items():
        value = error.get(name, "")
        if not isinstance(value, str):
            raise Violation(f"error.{name} must be a string, got {type(value).__name__}")
        checked[name] = value[-cap:] if name == "traceback" else value[:cap]
    unknown = set(error) - set(ERROR_CAPS)
    if unknown:
        raise Violation(f"error has unknown field(s) {', '.join(sorted(map(str, unknown)))[:200]}")
    if not checked["reason"]:
        checked["reason"] = f"{checked['type'] or 'Error'}: {checked['message']}"[:500]
    return checked


def parse_result(message: dict[str, Any], job_id: str, queue: str = "",
                 group: str | None = None) -> Report:
    """Check a ``"t": "result"`` message of job `job_id` (of `queue`, in `group`)."""
    ok = message.get("ok")
    if not isinstance(ok, bool):
        raise Violation(f"result.ok must be true or false, got {ok!r}"[:200])
    if ok:
        unknown = set(message) - {"t", "ok", "result", "followups", "batch"}
        if unknown:
            raise Violation(f"result has unknown field(s) {', '.join(sorted(unknown))[:200]}")
        followups = message.get("followups", [])
        if not isinstance(followups, list):
            raise Violation(f"followups must be a list, got {type(followups).__name__}")
        if len(followups) > MAX_FOLLOWUPS:
            raise Violation(f"{len(followups)} follow-ups, over the limit of {MAX_FOLLOWUPS}")
        for i, spec in enumerate(followups):
            problem = check_followup(spec, job_id, i + 1)
            if problem:
                raise Violation(f"followups[{i}]: {problem}")
        opened = message.get("batch")
        if opened is not None:
            problem = check_opened_batch(opened, job_id, queue)
            if problem:
                raise Violation(f"batch: {problem}")
        result = json.dumps(message.get("result"), separators=(",", ":"), allow_nan=False)
        return Report(True, result_json=result, followups=followups, batch=opened)
    unknown = set(message) - {"t", "ok", "error", "fatal", "retry", "throttle"}
    if unknown:
        raise Violation(f"result has unknown field(s) {', '.join(sorted(unknown))[:200]}")
    fatal = message.get("fatal", False)
    if not isinstance(fatal, bool):
        raise Violation(f"result.fatal must be true or false, got {fatal!r}"[:200])
    report = Report(False, error=_check_error(message.get("error")), fatal=fatal)
    if ("retry" in message) + ("throttle" in message) + fatal > 1:
        raise Violation("a result is at most one of fatal, retry and throttle")
    if "retry" in message:
        report.snooze = _check_delay(message["retry"], "retry", "counted", MAX_SNOOZE_MS)
    if "throttle" in message:
        report.throttle = _check_delay(message["throttle"], "throttle", "group", MAX_THROTTLE_MS)
        if report.throttle[1] and not group:
            raise Violation("throttle.group for a job that has no group")
    return report


def _check_delay(value: Any, name: str, flag: str, cap_ms: int) -> tuple[int, bool]:
    """A retry's or a throttle's {"delay_ms", flag} as (delay ms, flag)."""
    if not isinstance(value, dict):
        raise Violation(f"{name} must be an object, got {type(value).__name__}")
    unknown = set(value) - {"delay_ms", flag}
    if unknown:
        raise Violation(f"{name} has unknown field(s) {', '.join(sorted(map(str, unknown)))}"[:200])
    delay = value.get("delay_ms")
    if not isinstance(delay, int) or isinstance(delay, bool) or not 0 <= delay <= cap_ms:
        raise Violation(f"{name}.delay_ms must be an integer from 0 to {cap_ms}, got {delay!r}"[:200])
    if not isinstance(on := value.get(flag, False), bool):
        raise Violation(f"{name}.{flag} must be true or false, got {on!r}"[:200])
    return delay, on


def check_opened_batch(opened: Any, job_id: str, queue: str) -> str:
    """Why `opened` is not a batch `JobContext.batch` of job `job_id` could have built
    ("" if it is): its id is the job's, its members are the job's follow-ups of that
    batch only, and it is opened on the job's own queue."""
    if not isinstance(opened, dict):
        return f"must be an object, got {type(opened).__name__}"
    unknown = set(opened) - {"id", "members", "on_success", "on_complete"}
    if unknown:
        return f"unknown field(s) {', '.join(sorted(map(str, unknown)))}"[:300]
    batch_id = f"{job_id}-b"
    if opened.get("id") != batch_id:
        return f"id must be {batch_id}"
    members = opened.get("members")
    if not isinstance(members, list) or not members:
        return "members must be a non-empty list"
    if len(members) > MAX_FOLLOWUPS:
        return f"{len(members)} members, over the limit of {MAX_FOLLOWUPS}"
    for i, spec in enumerate(members):
        problem = check_followup(spec, job_id, i + 1, batch=(batch_id, queue))
        if problem:
            return f"members[{i}]: {problem}"
    for name in ("on_success", "on_complete"):
        if name in opened:
            problem = check_callback(opened[name], f"{batch_id}-{name}", batch_id)
            if problem:
                return f"{name}: {problem}"
    return ""
