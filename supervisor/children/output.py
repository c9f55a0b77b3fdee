"""A job's stdout and stderr: captured, capped, attributed.

Each child's fds 1 and 2 are the write end of a pipe the supervisor reads (never the
supervisor's own log: a job that truncates or floods its stdout touches only its
pipe). Every line goes to the log with the job's id, escaped so that a job cannot
forge a log line of its own; past `max_output_bytes` the rest is read and dropped, and
counted. The last `TAIL_BYTES` are kept for the job record (field `output`, shown by
`forq job ID`).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("forq.job")

TAIL_BYTES = 4096  # kept in the job record
LINE_MAX = 4096  # a longer line is cut into pieces of this size
READ_PER_TURN = 256 * 1024  # one child's flood must not starve the supervisor's loop


def _printable(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class OutputReader:
    """The supervisor's reader of one child's output pipe."""

    def __init__(self, job_id: str, task: str, cap: int, who: str = "") -> None:
        self.job_id = job_id
        self.task = task
        self.who = who or f"job {job_id}"  # what its log lines start with
        self.cap = cap  # bytes logged at most; 0 = nothing logged
        self.seen = 0  # bytes read
        self.dropped = 0  # bytes read past the cap
        self.partial = bytearray()
        self.tail = bytearray()

    def read(self, fd: int) -> bool:
        """Read what is there (up to READ_PER_TURN); False at EOF."""
        budget = READ_PER_TURN
        while budget > 0:
            try:
                chunk = os.read(fd, min(65536, budget))
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                self.finish()
                return False
            budget -= len(chunk)
            self.feed(chunk)
        return True

    def feed(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        self.tail += chunk
        if len(self.tail) > 2 * TAIL_BYTES:
            del self.tail[:-TAIL_BYTES]
        room = self.cap - (self.seen - len(chunk) - self.dropped)
        if room < len(chunk):
            self.dropped += len(chunk) - max(room, 0)
            chunk = chunk[:max(room, 0)]
        self.partial += chunk
        while True:
            end = self.partial.find(b"\n")
            if end < 0 and len(self.partial) < LINE_MAX:
                break
            cut = end if 0 <= end < LINE_MAX else LINE_MAX
            self._line(bytes(self.partial[:cut]))
            del self.partial[:cut + 1 if cut == end else cut]

    def finish(self) -> None:
        """EOF: the last line without its newline, and what was dropped."""
        if self.partial:
            self._line(bytes(self.partial))
            self.partial.clear()
        if self.dropped:
            log.warning("%s %s: %d byte(s) of output dropped over max_output_bytes (%d)",
                        self.who, self.task, self.dropped, self.cap,
                        extra={"job": self.job_id, "task": self.task, "event": "output"})

    def _line(self, data: bytes) -> None:
        log.info("%s output: %s", self.who, _printable(data),
                 extra={"job": self.job_id, "task": self.task, "event": "output"})

    def record(self) -> str:
        """What the job record keeps: the last TAIL_BYTES, and what was dropped."""
        if not self.seen:
            return ""
        text = bytes(self.tail[-TAIL_BYTES:]).decode("utf-8", errors="replace")
        if self.seen > TAIL_BYTES:
            text = f"[{self.seen - TAIL_BYTES} earlier byte(s) not kept]\n" + text
        return text
