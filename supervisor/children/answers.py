"""Answers: what the supervisor writes back to a child on its channel, without blocking.

A step's answer is one short line and goes out in one write (`JobNotes`). A page of a
job's parents' results can be a mebibyte and more, over what a socket holds, so it is
written as the child reads it: what does not fit waits here, and the event loop says
when the socket takes more. A child that does not read keeps at most that one page
here until it ends (it may ask for the next page only once this one is written whole);
its end drops it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from forq.supervisor.children.running import RunningChild
from forq.supervisor.loop.eventloop import EventLoop


class Answers:
    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        # job id -> (the child, what is left to write, called once it is all written)
        self.unsent: dict[str, tuple[RunningChild, memoryview, Callable[[], None]]] = {}

    def send(self, child: RunningChild, data: bytes, done: Callable[[], None]) -> None:
        """Write `data` to the child's channel; `done()` once all of it is written (never,
        if the child ends first)."""
        self.unsent[child.job_id] = (child, memoryview(data), done)
        self._flush(child.job_id)

    def _flush(self, job_id: str) -> None:
        entry = self.unsent.get(job_id)
        if entry is None:
            return
        child, left, done = entry
        if child.pipe < 0:  # it ended: nobody reads
            del self.unsent[job_id]
            return
        try:
            while left:
                left = left[os.write(child.pipe, left):]
        except BlockingIOError:
            self.unsent[job_id] = (child, left, done)
            self.loop.add_writer(child.pipe, lambda _f, _m: self._flush(job_id))
            return
        except OSError:  # its end is closed: it is exiting
            left = memoryview(b"")
            done = _nothing
        self.loop.remove_writer(child.pipe)
        del self.unsent[job_id]
        done()

    def forget_ended(self) -> None:
        """Drop what waits for children that ended (their channel is closed)."""
        for job_id in [j for j, (child, _, _) in self.unsent.items() if child.pipe < 0]:
            del self.unsent[job_id]


def _nothing() -> None:
    pass
