"""JobNotes: what running children say before their result — progress and durable
steps — on its way to Redis, and the answers back to the children.

Each child's `MessageReader` keeps the checked notes: its latest progress (unsent) and
at most one step awaiting an answer (a child sends its next step only once answered).
Both are written by Lua scripts fenced by the lease token, so a supervisor that lost
the lease writes nothing:

* progress rides with the next lease extension (`send_progress`, one `progress` call
  per queue in the extension's pipeline) and with the report of the child's end
  (`Reporter`): at most one write per job per `lease_ttl/3`, however often a handler
  reports;
* a step is recorded in the next loop turn (`send_steps`, in `_sync`'s pipeline,
  before the reports: a step and the ack of the same job land in that order), since
  the handler waits for it; the child is then answered "ok", or "lost" and stopped.

A child that does not read its answers cannot block the supervisor: the answer is
written without blocking, and a full socket stops that child as a protocol violation.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

from forq import Queue
from forq.channel import answer
from forq.store.transitions import parse_progress
from forq.supervisor.children.running import KillReason, RunningChild
from forq.supervisor.fork.messages import Progress
from forq.supervisor.leases.calls import leasing
from forq.supervisor.observe.metrics import Metrics

log = logging.getLogger("forq.supervisor")


Entry = tuple[str, str, float, str]  # a `progress` call's: job id, token, value, message


class ProgressBatch:
    """The progress calls of one pipeline: one per queue, in `groups`' order."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.groups: dict[str, list[tuple[RunningChild, Entry]]] = {}
        self.metrics = metrics

    def __len__(self) -> int:
        return len(self.groups)

    def answered(self, replies: list[Any] | None) -> None:
        """Their replies (None: the pipeline failed). A write that did not land keeps
        its value for the next one."""
        for i, (name, group) in enumerate(self.groups.items()):
            if replies is None or isinstance(replies[i], Exception):
                for child, entry in group:
                    JobNotes.progress_failed(child, entry)
            elif self.metrics is not None:
                self.metrics.progress_written(name, parse_progress(replies[i]).count("ok"))


class JobNotes:
    def __init__(self, queue_for: Callable[[str], Queue], metrics: Metrics | None = None) -> None:
        self.queue_for = queue_for
        self.metrics = metrics
        self.stepping: dict[str, RunningChild] = {}  # job id -> a child with a step to record

    def heard(self, child: RunningChild) -> None:
        """The child's pipe was read: note a step that waits for Redis."""
        if child.reader.steps:
            self.stepping[child.job_id] = child

    @property
    def waiting(self) -> bool:
        return bool(self.stepping)

    # -- progress ------------------------------------------------------------------------

    @staticmethod
    def progress_entry(child: RunningChild, token: str) -> Entry | None:
        """The child's unsent progress as a `progress` call entry, taken from it (see
        `progress_failed` to put it back)."""
        progress = child.reader.progress
        if progress is None:
            return None
        child.reader.progress = None
        return (child.job_id, token, progress.value, progress.message)

    @staticmethod
    def progress_failed(child: RunningChild, entry: Entry) -> None:
        """The write did not land: keep the value for the next one, unless a newer came."""
        if child.reader.progress is None:
            child.reader.progress = Progress(entry[2], entry[3])

    def send_progress(self, pipe: Any, children: Iterable[RunningChild],
                      token: Callable[[str], str | None]) -> ProgressBatch:
        """Queue one `progress` call per queue for every child with unsent progress whose
        lease is held (`ProgressBatch.answered` reads the replies)."""
        batch = ProgressBatch(self.metrics)
        for child in children:
            held = token(child.job_id)
            entry = self.progress_entry(child, held) if held else None
            if entry is not None:
                batch.groups.setdefault(child.queue, []).append((child, entry))
        for name, group in batch.groups.items():
            leasing(self.queue_for(name)).record_progress([entry for _, entry in group], client=pipe)
        return batch

    # -- steps ---------------------------------------------------------------------------

    def send_steps(self, pipe: Any, token: Callable[[str], str | None],
                   ready: Callable[[str], bool] | None = None) -> list[RunningChild]:
        """Queue a `step` call for each child's open step (of a queue whose shard is
        `ready`, the others wait); returns the children in the order their replies will
        come (`steps_answered`)."""
        sent = []
        waiting = {}
        for job_id, child in list(self.stepping.items()):
            if not child.reader.steps:
                continue
            if ready is not None and not ready(child.queue):
                waiting[job_id] = child
                continue
            held = token(job_id) or child.lease.token
            step = child.reader.steps[0]
            leasing(self.queue_for(child.queue)).record_step(job_id, held, step.name, step.result_json,
                                                    client=pipe)
            sent.append(child)
        self.stepping = waiting
        return sent

    def steps_failed(self, sent: list[RunningChild]) -> None:
        """The pipeline did not run (Redis down): the steps wait for the next turn."""
        for child in sent:
            self.stepping[child.job_id] = child

    def steps_answered(self, sent: list[RunningChild], replies: list[Any]) -> None:
        for child, reply in zip(sent, replies, strict=True):
            if isinstance(reply, Exception):
                log.error("job %s %s: step not recorded: %s; trying again", child.job_id,
                          child.task, reply)
                self.stepping[child.job_id] = child
                continue
            step = child.reader.steps.pop(0)
            ok = reply == "ok"
            if self.metrics is not None:
                self.metrics.step_recorded(child.queue, ok)
            if not ok:
                log.warning("job %s %s: step %r answered lost (lease no longer ours); "
                            "stopping its child", child.job_id, child.task, step.name[:200])
            self._answer(child, step.name, ok)
            if not ok:
                child.stop(KillReason.LEASE_LOST, grace=0)
            elif child.reader.steps:  # read meanwhile (a hostile child): never answered
                self.stepping[child.job_id] = child

    @staticmethod
    def _answer(child: RunningChild, name: str, ok: bool) -> None:
        """Tell the child, without ever blocking: a child that does not read its
        answers has broken the protocol."""
        child.reader.answered()
        if child.pipe < 0:
            return  # it ended meanwhile: the step is recorded, nobody waits for it
        try:
            os.write(child.pipe, answer(name, ok))
        except BlockingIOError:
            if child.kill_reason is None:
                log.warning("job %s %s: does not read its step answers; killing its child",
                            child.job_id, child.task)
                child.reader.violation = child.reader.violation or "does not read its answers"
                child.stop(KillReason.PROTOCOL, grace=0)
        except OSError:
            pass  # its end is closed: it is exiting
