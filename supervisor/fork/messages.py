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
import time
from dataclasses import dataclass, field
from typing import Any

from forq.channel import (
    MAX_PROGRESS_MESSAGE,
    MAX_SNOOZE_MS,
    MAX_STEP_BYTES,
    MAX_STEP_NAME,
    MAX_STEPS,
    MAX_STEPS_BYTES,
    MAX_THROTTLE_MS,
)
from forq.payload import check_callback, check_followup

RESULT_OVERHEAD = 64 * 1024  # the envelope and follow-ups beside the result itself
MAX_FOLLOWUPS = 1000
# an error's fields, capped where the child builds them and checked again here
ERROR_CAPS = {"type": 200, "message": 64 * 1024, "traceback": 8192, "reason": 500}
# progress messages a child may send: a burst, then this many a second (an honest child
# sends at most two a second: `forq.channel` throttles); more is a flood, a violation
PROGRESS_BURST = 100
PROGRESS_RATE = 20.0
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


class MessageReader:
    """The parent's reader of one child's pipe: feed it bytes as they arrive.

    A line over `line_cap` bytes is not kept (the parent's memory is not the child's to
    fill): it sets `overflow`, which the parent reports as a result too large. The first
    violation sets `violation` and stops reading; the parent then kills the child."""

    def __init__(self, job_id: str, line_cap: int, recorded_steps: int = 0,
                 queue: str = "", recorded_bytes: int = 0, group: str | None = None) -> None:
        self.job_id = job_id
        self.line_cap = line_cap
        self.queue = queue
        self.group = group
        self.buf = bytearray()
        self.report: Report | None = None
        self.violation: str = ""
        self.overflow = False
        # what the child said before its result, for the parent to take (`notes`)
        self.progress: Progress | None = None  # the latest, not yet taken
        self.steps: list[Step] = []  # sent, not yet taken
        self.step_open = False  # a step awaits the parent's answer (`answered`)
        self.parents_open = False  # a request for parents awaits its answer
        self.parents_next = 0  # where its next page starts (-1: after the last one)
        self.step_count = recorded_steps  # this job's steps, recorded and sent
        self.step_bytes = recorded_bytes  # and their results' bytes
        self.began: Any = None  # the result's "began", unchecked (`children.cost`)
        self._allowance = float(PROGRESS_BURST)
        self._allowance_at = time.monotonic()

    @property
    def done(self) -> bool:
        """Nothing more from this child will be read (a result, or a fault)."""
        return bool(self.violation) or self.overflow

    def feed(self, data: bytes) -> None:
        if self.done:
            return
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if len(self.buf) + end - start > self.line_cap:
                self.overflow = True
                return
            self.buf += data[start:end]
            start = end + 1
            line, self.buf = bytes(self.buf), bytearray()
            self._line(line)
            if self.done:
                return
        if len(self.buf) + len(data) - start > self.line_cap:
            self.overflow = True
            return
        self.buf += data[start:]

    def answered(self) -> None:
        """The parent answered the open step: the child may send the next one."""
        self.step_open = False

    def parents_answered(self, next_page: int) -> None:
        """The answer to the request for parents is written whole; the next page starts
        at parent `next_page` (-1: no more)."""
        self.parents_open = False
        self.parents_next = next_page

    def _parents(self, message: dict[str, Any]) -> None:
        unknown = set(message) - {"t"}
        if unknown:
            raise Violation(f"parents has unknown field(s) {', '.join(sorted(unknown))[:200]}")
        if self.step_open or self.parents_open:
            raise Violation("asked for its parents before its previous request was answered")
        if self.parents_next < 0:
            raise Violation("asked for its parents again after the last page")
        self.parents_open = True

    def _check_rate(self) -> None:
        now = time.monotonic()
        self._allowance = min(float(PROGRESS_BURST),
                              self._allowance + (now - self._allowance_at) * PROGRESS_RATE)
        self._allowance_at = now
        if self._allowance < 1:
            raise Violation(f"progress sent more than {PROGRESS_RATE:g} times a second")
        self._allowance -= 1

    def _step(self, message: dict[str, Any]) -> None:
        if self.step_open:
            raise Violation("sent a step before its previous step was answered")
        if self.parents_open:
            raise Violation("sent a step before its request for parents was answered")
        step = check_step(message)
        if self.step_count >= MAX_STEPS:
            raise Violation(f"more than {MAX_STEPS} steps")
        if self.step_bytes + len(step.result_json) > MAX_STEPS_BYTES:
            raise Violation(f"step results over {MAX_STEPS_BYTES} bytes in all")
        self.step_count += 1
        self.step_bytes += len(step.result_json)
        self.step_open = True
        self.steps.append(step)

    def finish(self) -> None:
        """End of the pipe: a message cut short is a violation."""
        if not self.done and self.buf:
            self._fault(f"message cut short ({len(self.buf)} bytes without an end of line)")

    def _fault(self, why: str) -> None:
        self.violation = why
        self.buf = bytearray()

    def _line(self, line: bytes) -> None:
        if self.report is not None:
            self._fault("wrote after its result")
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as exc:
            self._fault(f"not JSON: {str(exc)[:200]}")
            return
        if not isinstance(message, dict):
            self._fault(f"a message must be a JSON object, got {type(message).__name__}")
            return
        kind = message.get("t")
        try:
            if kind == "result":
                self.began = message.pop("began", None)
                self.report = parse_result(message, self.job_id, self.queue, self.group)
            elif kind == "progress":
                self._check_rate()
                self.progress = check_progress(message)
            elif kind == "step":
                self._step(message)
            elif kind == "parents":
                self._parents(message)
            else:
                raise Violation(f"unknown message kind {kind!r}"[:200])
        except Violation as exc:
            self._fault(str(exc))
        except (ValueError, TypeError, RecursionError) as exc:  # e.g. a result JSON cannot re-encode
            self._fault(f"{type(exc).__name__}: {str(exc)[:200]}")
