"""MessageReader: the parent's reader of one child's channel.

What a child may say, and the checks of each message, are `fork.messages`; this reads
the bytes as they arrive, under a line cap, and keeps the state a message is judged
against (a result is the last message, one step or request for parents at a time, a
rate of progress messages). The first violation stops the reading.
"""

from __future__ import annotations

import json
import time
from typing import Any

from forq.channel import MAX_STEPS, MAX_STEPS_BYTES
from forq.supervisor.fork.messages import (
    Progress,
    Report,
    Step,
    Violation,
    check_progress,
    check_step,
    parse_result,
)

# progress messages a child may send: a burst, then this many a second (an honest child
# sends at most two a second: `forq.channel` throttles); more is a flood, a violation
PROGRESS_BURST = 100
PROGRESS_RATE = 20.0


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
        after = self._after_last()
        if after:
            self._fault(after)
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as exc:
            self._fault(f"not JSON: {str(exc)[:200]}")
            return
        if not isinstance(message, dict):
            self._fault(f"a message must be a JSON object, got {type(message).__name__}")
            return
        try:
            self._message(message)
        except Violation as exc:
            self._fault(str(exc))
        except (ValueError, TypeError, RecursionError) as exc:  # e.g. a result JSON cannot re-encode
            self._fault(f"{type(exc).__name__}: {str(exc)[:200]}")

    def _after_last(self) -> str:
        """Why no line may come now ("" if one may): the result was the last message."""
        return "wrote after its result" if self.report is not None else ""

    def _message(self, message: dict[str, Any]) -> None:
        kind = message.get("t")
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
