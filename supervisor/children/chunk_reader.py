"""ChunkReader: the parent's reader of a chunk's channel (`task(chunk=N)`).

A chunk's child runs up to N jobs of one task and writes one result message per job,
each naming its job (``"job": id``, otherwise the schema of `fork.messages`), as the
handler reports it, and first ``{"t": "began", "at": CLOCK_MONOTONIC}`` (the
handler's first line, for the run's cost). Like any child it is untrusted: a result
for a job that is not in its chunk, a second result for a job, anything after the
last job's result, or any other kind of message (progress, steps, parents: a chunk's
handler has no `current()`) is a `Violation`, and the jobs it did not report end as
a crash (`chunks.outcomes`). The results read before the violation stand: each was a
well-formed report for a job of the chunk, fenced by that job's own token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from forq.supervisor.children.reader import MessageReader
from forq.supervisor.fork.messages import Report, Violation, parse_result


class ChunkReader(MessageReader):
    def __init__(self, job_ids: Sequence[str], line_cap: int, queue: str = "",
                 groups: Mapping[str, str | None] | None = None) -> None:
        super().__init__(job_ids[0], line_cap, queue=queue)
        self.job_ids = frozenset(job_ids)
        self.size = len(job_ids)
        self.groups = dict(groups or {})
        self.reports: dict[str, Report] = {}  # job id -> its checked result, in order

    def _after_last(self) -> str:
        if len(self.reports) >= self.size:
            return f"wrote after the results of all {self.size} jobs of its chunk"
        return ""

    def _message(self, message: dict[str, Any]) -> None:
        kind = message.get("t")
        if kind == "began":
            if set(message) - {"t", "at"} or self.began is not None or self.reports:
                raise Violation("a chunk says began once, first, with only \"at\"")
            self.began = message.get("at")  # unchecked here: `cost` checks it
            return
        if kind != "result":
            raise Violation(f"a chunk sends only results, not {kind!r}"[:200])
        job_id = message.pop("job", None)
        if not isinstance(job_id, str) or job_id not in self.job_ids:
            raise Violation(f"reported for job {job_id!r}, which is not in its chunk"[:200])
        if job_id in self.reports:
            raise Violation(f"reported job {job_id} twice")
        self.reports[job_id] = parse_result(message, job_id, self.queue,
                                            self.groups.get(job_id))
