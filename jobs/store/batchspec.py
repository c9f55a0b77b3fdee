"""A batch as the scripts read it: its members' specs and its callbacks, validated.

Pure (no redis): `Queue.batch`, `AsyncQueue.batch` and a handler's `current().batch`
build batches here, so a bad batch is refused the same way everywhere, naming the
argument (``jobs[3]: ...``, ``on_success: ...``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from forq.errors import PayloadError
from forq.payload import DEFAULT_MAX_PAYLOAD_BYTES, build_spec, new_job_id
from forq.store.keys import QueueKeys

MAX_BATCH = 100_000  # members of one batch (its record lists them all)
CALLBACKS = ("on_success", "on_complete")
# a member's id is the batch's and its place; an idempotency key could hand back another
# job, which would never count in this batch
MEMBER_FORBIDS = ("job_id", "key", "unique_for")


@dataclass
class BatchSpec:
    """What opening a batch sends: its record (total, callbacks, members) and its
    members' specs by queue (the batch's own queue's go with the batch script)."""

    id: str
    queue: str
    record: dict[str, Any]
    specs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def member_ids(self) -> list[str]:
        return [member_id for _, member_id in self.record["members"]]


def _callback(name: str, value: Any, batch_id: str, queue: str,
              max_payload_bytes: int) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = {"task": value}
    if not isinstance(value, Mapping):
        raise PayloadError(f"{name} must be a task name or a mapping with task and options, "
                           f"got {type(value).__name__}")
    options = dict(value)
    task = options.pop("task", None)
    if options.pop("queue", queue) != queue:
        raise PayloadError(f"{name}: a batch's callbacks run on its own queue {queue!r}; "
                           "enqueue to another queue from the callback")
    for forbidden in ("job_id", "depends_on"):
        if forbidden in options:
            raise PayloadError(f"{name}: {forbidden} cannot be set on a batch callback")
    kwargs = options.get("kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise PayloadError(f"{name}: kwargs must be a mapping, got {type(kwargs).__name__}")
    if "batch_id" in kwargs:
        raise PayloadError(f"{name}: kwargs['batch_id'] is set by forq (the batch's id)")
    options["kwargs"] = {**kwargs, "batch_id": batch_id}
    options["job_id"] = f"{batch_id}-{name}"
    try:
        return build_spec(task, options, max_payload_bytes=max_payload_bytes)
    except ValueError as exc:
        raise PayloadError(f"{name}: {exc}") from None


def build_batch(queue: str, jobs: Iterable[Mapping[str, Any]], on_success: Any = None,
                on_complete: Any = None, *, batch_id: str | None = None,
                parent: str | None = None,
                max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> BatchSpec:
    """Validate a batch opened on `queue`: `jobs` as for ``enqueue_many`` (each may name
    another ``queue``), callbacks as a task name or a mapping with ``task`` and options.
    `parent`: the job opening it from its handler (its members' parent)."""
    if isinstance(jobs, (str, bytes, Mapping)) or not isinstance(jobs, Iterable):
        raise PayloadError(f"batch: jobs must be a list of job mappings, got {type(jobs).__name__}")
    items = list(jobs)
    if not items:
        raise PayloadError("batch: jobs is empty; a batch needs at least one job")
    if len(items) > MAX_BATCH:
        raise PayloadError(f"batch: {len(items)} jobs, over the limit of {MAX_BATCH} per batch")
    if batch_id is not None and (not isinstance(batch_id, str) or not batch_id
                                 or len(batch_id) > 200):
        raise PayloadError(f"batch: batch_id must be a string of 1 to 200 characters, got {batch_id!r}")
    bid = batch_id or new_job_id()
    batch = BatchSpec(bid, queue, {"total": len(items), "members": []})
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise PayloadError(f"jobs[{i}]: must be a mapping with task and options, "
                               f"got {type(item).__name__}")
        options = dict(item)
        task = options.pop("task", None)
        member_queue = options.pop("queue", None) or queue
        for forbidden in MEMBER_FORBIDS:
            if forbidden in options:
                raise PayloadError(f"jobs[{i}]: {forbidden} cannot be set on a batch member "
                                   f"(its id is the batch's: {bid}-{i + 1})")
        try:
            QueueKeys(member_queue)
            spec = build_spec(task, options, max_payload_bytes=max_payload_bytes)
        except ValueError as exc:
            raise PayloadError(f"jobs[{i}]: {exc}") from None
        spec.update(id=f"{bid}-{i + 1}", batch=bid, batch_queue=queue)
        if parent:
            spec["parent"] = parent
        batch.specs.setdefault(member_queue, []).append(spec)
        batch.record["members"].append([member_queue, spec["id"]])
    for name, value in zip(CALLBACKS, (on_success, on_complete), strict=True):
        callback = _callback(name, value, bid, queue, max_payload_bytes)
        if callback is not None:
            batch.record[name] = callback
    return batch
