"""The job record as producers and operators see it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from forq.errors import JobFailed, JobNotFound, JobTimeout

if TYPE_CHECKING:
    from forq.queue import Queue

SCHEDULED = "scheduled"
PENDING = "pending"
ACTIVE = "active"
SUCCEEDED = "succeeded"
DEAD = "dead"
CANCELLED = "cancelled"
WAITING = "waiting"  # on its dependencies (depends_on)
STATES = (SCHEDULED, PENDING, ACTIVE, SUCCEEDED, DEAD, CANCELLED, WAITING)
TERMINAL = frozenset({SUCCEEDED, DEAD, CANCELLED})

# a finished run's `cost` field, in order (lua/includes/cost.lua)
COST_FIELDS = ("cpu_user_ms", "cpu_system_ms", "peak_memory", "wall_ms", "start_latency_ms")
_INT_FIELDS = (
    "priority",
    "attempts",
    "crashes",
    "max_attempts",
    "max_crashes",
    "snoozes",
    "max_snoozes",
    "timeout_ms",
    "memory_limit",
    "result_ttl_ms",
    "max_result_bytes",
    "backoff_base_ms",
    "backoff_max_ms",
    "enqueued_at",
    "run_at",
    "started_at",
    "finished_at",
    "lease_deadline",
    "expire_at",
    "progress_at",
    "step_count",
)
STEP_PREFIX = "step:"  # a durable step's field in the job hash (lua/step.lua)


def loads_field(text: str | None) -> Any:
    """A JSON field of a job record as Python; the raw text if it is not JSON."""
    if text is None or text == "":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclass
class Job:
    """A snapshot of one job's record (``Queue.get``), or the handle `enqueue` returns.

    Times (`enqueued_at`, `run_at`, ...) are Redis-clock milliseconds in `fields`;
    `history` entries carry ``at`` in seconds, the unit the CLI prints.
    """

    id: str
    queue: str
    fields: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    _queue: Queue | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_record(
        cls, queue: Queue | None, record: dict[str, str], history: list[str]
    ) -> Job:
        fields: dict[str, Any] = dict(record)
        for name in _INT_FIELDS:
            if name in fields:
                try:
                    fields[name] = int(float(fields[name]))
                except ValueError:
                    pass
        entries = []
        for raw in history:
            entry = loads_field(raw)
            if isinstance(entry, dict) and "at" in entry:
                entry["at"] = entry["at"] / 1000.0
            entries.append(entry)
        return cls(fields["id"], fields["queue"], fields, entries, queue)

    @classmethod
    def handle(cls, queue: Queue, job_id: str, status: str) -> Job:
        """What `enqueue` returns: the id, and how the enqueue went (``enqueue_status``:
        pending, scheduled, waiting; duplicate — then `id` is the live job holding the
        key; replaced — `id` is the waiting job that took this call's arguments)."""
        return cls(job_id, queue.name, {"id": job_id, "queue": queue.name,
                                        "enqueue_status": status}, [], queue)

    @property
    def task(self) -> str:
        return str(self.fields.get("task", ""))

    @property
    def state(self) -> str:
        return str(self.fields.get("state", ""))

    @property
    def args(self) -> list[Any]:
        return loads_field(self.fields.get("args")) or []

    @property
    def kwargs(self) -> dict[str, Any]:
        return loads_field(self.fields.get("kwargs")) or {}

    @property
    def attempts(self) -> int:
        return int(self.fields.get("attempts", 0))

    @property
    def crashes(self) -> int:
        return int(self.fields.get("crashes", 0))

    @property
    def snoozes(self) -> int:
        """How often its handler put it off (`raise Retry(...)`), over all its runs."""
        return int(self.fields.get("snoozes", 0))

    @property
    def result(self) -> Any:
        return loads_field(self.fields.get("result"))

    @property
    def error(self) -> Any:
        return loads_field(self.fields.get("error"))

    @property
    def cost(self) -> dict[str, int | None] | None:
        """What its last run cost, as its supervisor measured it: cpu_user_ms,
        cpu_system_ms (its whole process tree), peak_memory (bytes), wall_ms and
        start_latency_ms (claim to the handler's first line; None if not known); None
        when no run has finished yet."""
        parts = str(self.fields.get("cost") or "").split(",")
        if len(parts) != len(COST_FIELDS):
            return None
        try:
            return {name: int(v) if v else None for name, v in zip(COST_FIELDS, parts, strict=True)}
        except ValueError:
            return None

    @property
    def output(self) -> str:
        """The tail of the last run's stdout and stderr (the supervisor keeps a few KiB)."""
        return self.fields.get("output") or ""

    @property
    def memory_trail(self) -> list[tuple[float, int]]:
        """Its death report's memory: the samples of its last seconds when its last run
        did not succeed, as (seconds before its end, bytes), oldest first ([]: none)."""
        raw = loads_field(self.fields.get("memory_trail"))
        if not isinstance(raw, list):
            return []
        return [(float(s), int(b)) for s, b in
                (p for p in raw if isinstance(p, list) and len(p) == 2)
                if isinstance(s, (int, float)) and isinstance(b, int)]

    @property
    def progress(self) -> dict[str, Any] | None:
        """The handler's last progress report, {"value": 0..1, "message", "at" (Redis
        seconds)}, or None if it sent none (`current().progress`)."""
        raw = self.fields.get("progress")
        if raw in (None, ""):
            return None
        try:
            value: float | None = float(raw)
        except (TypeError, ValueError):
            value = None
        at = self.fields.get("progress_at")
        return {"value": value, "message": str(self.fields.get("progress_message") or ""),
                "at": int(at) / 1000.0 if isinstance(at, int) else None}

    @property
    def steps(self) -> dict[str, Any]:
        """The durable steps recorded so far (`current().step`): name -> result, in the
        order they were recorded."""
        return {name: entry.get("result") for name, entry in self.step_records().items()}

    def step_records(self) -> dict[str, dict[str, Any]]:
        """Each recorded step's {"n": its number, "at": Redis ms, "result"}, in order."""
        found = []
        for name, raw in self.fields.items():
            if isinstance(name, str) and name.startswith(STEP_PREFIX):
                entry = loads_field(raw)
                if not isinstance(entry, dict):
                    entry = {"result": entry}
                found.append((name[len(STEP_PREFIX):], entry))
        def number(item: tuple[str, dict[str, Any]]) -> int:
            n = item[1].get("n")
            return n if isinstance(n, int) else 1 << 62

        found.sort(key=number)
        return dict(found)

    def recorded_steps(self) -> dict[str, str]:
        """Each recorded step's result as compact JSON: what a re-run's child gets."""
        return {name: json.dumps(result, separators=(",", ":"))
                for name, result in self.steps.items()}

    @property
    def reason(self) -> str | None:
        """Why the job is where it is: the dead reason, else the last error message."""
        if self.fields.get("dead_reason"):
            return str(self.fields["dead_reason"])
        err = self.error
        if isinstance(err, dict):
            found = err.get("reason") or err.get("message")
            return str(found) if found is not None else None
        return None

    @property
    def depends_on(self) -> list[str]:
        """The jobs it waits on or waited on (``depends_on``), [] for none."""
        return loads_field(self.fields.get("depends_on")) or []

    @property
    def waiting_on(self) -> int:
        """How many of `depends_on` have not ended yet (0 once released)."""
        return int(self.fields.get("waiting_on") or 0) if self.state == WAITING else 0

    @property
    def batch(self) -> str | None:
        """The id of the batch it belongs to (its queue: ``fields["batch_queue"]``)."""
        return self.fields.get("batch") or None

    def to_dict(self) -> dict[str, Any]:
        """The shape `forq job ID --json` prints."""
        out = {
            "id": self.id,
            "queue": self.queue,
            "task": self.task,
            "state": self.state,
            "attempts": self.attempts,
            "crashes": self.crashes,
            "snoozes": self.snoozes,
            "args": self.args,
            "kwargs": self.kwargs,
            "result": self.result,
            "error": self.error,
            "reason": self.reason,
            "output": self.output,
            "progress": self.progress,
            "steps": self.steps,
            "history": self.history,
        }
        for name in ("priority", "enqueued_at", "run_at", "started_at", "finished_at",
                     "owner", "code", "key", "parent", "batch", "batch_queue", "child_batch"):
            if name in self.fields:
                out[name] = self.fields[name]
        if self.memory_trail:
            out["memory_trail"] = [list(sample) for sample in self.memory_trail]
        if "depends_on" in self.fields:
            out["depends_on"] = self.depends_on
            out["waiting_on"] = self.waiting_on
        if self.cost is not None:
            out["cost"] = self.cost
        return out

    def refresh(self) -> Job:
        """Re-read the record; returns the fresh snapshot."""
        if self._queue is None:
            raise JobNotFound(f"job {self.id} has no queue to read from")
        return self._queue.get(self.id)

    def wait(self, timeout: float = 30.0, poll: float = 0.05) -> Any:
        """Block until the job finishes; return its result or raise `JobFailed` (dead or
        cancelled), or `JobTimeout`.

        Blocks on the queue's event stream (XREAD BLOCK), so it returns within a round
        trip of the job's end, and reads the job when its end shows there (and at least
        every second). On a queue whose events are off, it reads the job after a wait
        that grows from `poll` to 0.5 s. A job enqueued with ``result_ttl=0`` keeps no
        record once it succeeds: waiting for it ends in `JobNotFound`.
        """
        if self._queue is None:
            raise JobNotFound(f"job {self.id} has no queue to read from")
        from forq.store import events

        queue = self._queue
        record, history = queue._run(events.wait(queue.keys, self.id, timeout, poll,
                                                 events.socket_timeout(queue.redis)))
        job = Job.from_record(queue, record, history)
        return settled(job, timeout, time.monotonic())[1]


def settled(job: Job, timeout: float, deadline: float) -> tuple[bool, Any]:
    """One look of a waiter (sync or async) at a fresh snapshot: (True, result) once
    succeeded; `JobFailed` once dead or cancelled; `JobTimeout` past `deadline`
    (``time.monotonic()``); else (False, None), to look again later."""
    if job.state == SUCCEEDED:
        return True, job.result
    if job.state in (DEAD, CANCELLED):
        raise JobFailed(job.id, job.state, job.reason)
    if time.monotonic() >= deadline:
        raise JobTimeout(f"job {job.id} still {job.state} after {timeout}s")
    return False, None
