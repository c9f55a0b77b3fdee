"""ParentReads: a handler asks for its job's parents and their results
(`current().parents()`, `parent_results()`); the supervisor reads them from Redis a page
at a time, in its loop turn's round trip, and answers on the child's channel.

Which parents is Redis's to say, never the child's: lua/parents.lua reads the job's
`depends_on` (or, for a batch's callback, the batch's members) in the job's own slot,
fenced by its lease token, so a run that lost its lease reads nothing and is stopped.
It reads the parents of that slot with it; a batch member on another queue is read from
its own slot in the next turns: its state, reason and the size of its result, then the
results that fit the page. A page holds at most `PARENTS_PAGE` parents and
`PARENTS_PAGE_BYTES` of results and reasons, or one parent however large (results are
capped where they are made, by max_result_bytes). Results go to the child as the JSON
text Redis holds: the supervisor never parses them. The answer is written without
blocking (`Answers`), and the child may ask for the next page only once it has the whole
of this one, and never again after the last (`MessageReader`): whatever a child asks,
the supervisor holds one page for it and reads each parent once per run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forq import Queue
from forq.channel import PARENTS_PAGE, PARENTS_PAGE_BYTES, parents_answer
from forq.store.control import parse_parents
from forq.store.keys import QueueKeys
from forq.supervisor.children.answers import Answers
from forq.supervisor.children.running import KillReason, RunningChild
from forq.supervisor.leases.calls import leasing

log = logging.getLogger("forq.supervisor")

Entry = list[str]  # [queue, id, state, result JSON, reason]; [queue, id] until read


@dataclass
class Ask:
    """A child's open request for a page of its parents, and how far its reading is."""

    child: RunningChild
    first: int  # the index of the page's first parent
    # "page": the script's read; "meta": the state, reason and result size of the
    # parents on other queues; "results": those results; "answering": being written
    phase: str = "page"
    entries: list[Entry] = field(default_factory=list)
    next: int = -1  # the index of the next page's first parent (-1: this is the last)
    fetch: list[int] = field(default_factory=list)  # entries whose result to read

    def remote(self) -> list[int]:
        return [i for i, entry in enumerate(self.entries) if len(entry) == 2]

    def queues(self) -> set[str]:
        return {self.child.queue} | {entry[0] for entry in self.entries}


class ParentReads:
    def __init__(self, queue_for: Callable[[str], Queue], answers: Answers) -> None:
        self.queue_for = queue_for
        self.answers = answers
        self.asks: dict[str, Ask] = {}  # job id -> its open request

    def heard(self, child: RunningChild) -> None:
        """The child's pipe was read: note a request for parents that waits for Redis
        (an earlier run's request of the same job, its child gone, gives way)."""
        ask = self.asks.get(child.job_id)
        if child.reader.parents_open and (ask is None or ask.child is not child):
            self.asks[child.job_id] = Ask(child, child.reader.parents_next)

    @property
    def waiting(self) -> bool:
        return any(ask.phase != "answering" and ask.child.pipe >= 0
                   for ask in self.asks.values())

    def send(self, pipe: Any, token: Callable[[str], str | None],
             ready: Callable[[str], bool] | None = None) -> list[tuple[Ask, int]]:
        """Queue each open request's next read (of the queues whose shard is `ready`);
        returns each request sent and how many replies are its own, in order."""
        sent = []
        self.answers.forget_ended()
        for job_id, ask in list(self.asks.items()):
            child = ask.child
            if child.pipe < 0:  # it ended: nobody waits
                del self.asks[job_id]
                continue
            if ask.phase == "answering" or (ready is not None
                                            and not all(map(ready, ask.queues()))):
                continue
            start = len(pipe.command_stack)
            if ask.phase == "page":
                held = token(job_id) or child.lease.token
                leasing(self.queue_for(child.queue)).read_parents(
                    job_id, held, ask.first, PARENTS_PAGE, PARENTS_PAGE_BYTES, client=pipe)
            elif ask.phase == "meta":
                for i in ask.remote():
                    key = QueueKeys(ask.entries[i][0]).job(ask.entries[i][1])
                    pipe.hmget(key, "state", "dead_reason", "error")
                    pipe.hstrlen(key, "result")
            else:
                for i in ask.fetch:
                    pipe.hget(QueueKeys(ask.entries[i][0]).job(ask.entries[i][1]), "result")
            sent.append((ask, len(pipe.command_stack) - start))
        return sent

    def answered(self, sent: list[tuple[Ask, int]], replies: list[Any]) -> None:
        """Redis answered what `send` queued: read on, or answer the child."""
        at = 0
        for ask, count in sent:
            mine, at = replies[at:at + count], at + count
            problem = next((r for r in mine if isinstance(r, Exception)), None)
            if problem is not None:
                log.error("job %s %s: reading its parents failed: %s; trying again",
                          ask.child.job_id, ask.child.task, problem)
                continue
            if ask.phase == "page":
                self._page(ask, mine[0])
            elif ask.phase == "meta":
                self._meta(ask, mine)
            else:
                self._results(ask, mine)

    def _page(self, ask: Ask, reply: Any) -> None:
        page = parse_parents(reply)
        if page.status != "ok":
            if page.status == "lost":
                log.warning("job %s %s: parents not read: lease no longer ours; stopping its "
                            "child", ask.child.job_id, ask.child.task)
                ask.child.stop(KillReason.LEASE_LOST, grace=0)
            self._answer(ask, parents_answer(None, status=page.status))
            return
        ask.entries, ask.next = page.entries, page.next
        if ask.remote():
            ask.phase = "meta"
        else:
            self._answer(ask, parents_answer(ask.entries, more=ask.next >= 0))

    def _meta(self, ask: Ask, replies: list[Any]) -> None:
        sizes = {}
        for k, i in enumerate(ask.remote()):
            (state, dead_reason, error), size = replies[2 * k], replies[2 * k + 1]
            ask.entries[i] = [*ask.entries[i], state or "", "", _reason(dead_reason, error)]
            sizes[i] = int(size or 0) if state == "succeeded" else 0
        used = 0
        ask.fetch = []
        for i, entry in enumerate(ask.entries):
            cost = sizes.get(i, len(entry[3])) + len(entry[4])
            if i > 0 and used + cost > PARENTS_PAGE_BYTES:  # the rest on the next page
                ask.entries, ask.next = ask.entries[:i], ask.first + i
                break
            used += cost
            if i in sizes and entry[2] == "succeeded":
                ask.fetch.append(i)
        if ask.fetch:
            ask.phase = "results"
        else:
            self._answer(ask, parents_answer(ask.entries, more=ask.next >= 0))

    def _results(self, ask: Ask, replies: list[Any]) -> None:
        for i, result in zip(ask.fetch, replies, strict=True):
            if result is None:  # its record went meanwhile
                ask.entries[i][2] = ""
            else:
                ask.entries[i][3] = result
        self._answer(ask, parents_answer(ask.entries, more=ask.next >= 0))

    def _answer(self, ask: Ask, data: bytes) -> None:
        ask.phase = "answering"
        self.answers.send(ask.child, data, lambda: self._written(ask))

    def _written(self, ask: Ask) -> None:
        if self.asks.get(ask.child.job_id) is ask:
            del self.asks[ask.child.job_id]
        ask.child.reader.parents_answered(ask.next)


def read_unfenced(client: Any, job: Any) -> list[Entry]:
    """`forq replay`'s answer: every parent of `job` (a `forq.Job`) and its result, as a
    child's answer holds them, read at once and without a lease (a replay holds none,
    and writes nothing)."""
    if job.fields.get("depends_on"):
        refs = [[job.queue, parent] for parent in json.loads(job.fields["depends_on"])]
    elif job.fields.get("callback_of"):
        members = client.lrange(QueueKeys(job.queue).batch(job.fields["callback_of"])
                                + ":members", 0, -1)
        refs = [json.loads(member) for member in members]
    else:
        return []
    pipe = client.pipeline(transaction=False)
    for queue, parent in refs:
        pipe.hmget(QueueKeys(queue).job(parent), "state", "result", "dead_reason", "error")
    return [[queue, parent, state or "", (result or "null") if state == "succeeded" else "",
             _reason(dead_reason, error)]
            for (queue, parent), (state, result, dead_reason, error)
            in zip(refs, pipe.execute(), strict=True)]


def _reason(dead_reason: str | None, error: str | None) -> str:
    """Why a parent did not succeed: its dead reason, else its last error's reason."""
    if dead_reason:
        return dead_reason
    try:
        reason = json.loads(error or "").get("reason")
    except (ValueError, AttributeError):
        return ""
    return reason if isinstance(reason, str) else ""
