"""Enqueue after commit, for Django: a job that only exists if the transaction commits.

    from forq.django import enqueue_on_commit

    with transaction.atomic():
        order = Order.objects.create(email=email)
        job_id = enqueue_on_commit(queue, "shop.send_receipt", order.id, email)

The job is validated at once (a bad argument raises inside the view, before anything
commits) and sent from ``transaction.on_commit``: a rollback sends nothing, a commit
sends it once. Its id is chosen up front, so the view can return it before the commit.

What this cannot promise: a process that dies (or a Redis that is unreachable) between
the commit and the enqueue loses the job, because the intent lived only in memory.
Where that matters, write the intent into the same transaction (an outbox row) and let
a relay enqueue it with the row's id as ``job_id`` (see docs/guide/frameworks.md,
"The outbox", and examples/fastapi_app).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from forq.payload import call_spec
from forq.queue import Queue


def enqueue_on_commit(queue: Queue, task: str, *args: Any, using: str | None = None,
                      robust: bool = False, **options: Any) -> str:
    """Enqueue `task` on `queue` once the current transaction on database `using`
    commits (at once in autocommit mode, as ``on_commit`` does); returns the job id.

    The options are `Queue.enqueue`'s. ``robust=True`` logs an enqueue that fails after
    the commit instead of raising it from the commit (Django's own ``robust``).
    """
    spec, _durable = call_spec(task, args, dict(options), queue.max_payload_bytes)
    options = dict(options, job_id=spec["id"])
    transaction.on_commit(lambda: queue.enqueue(task, *args, **options), using=using,
                          robust=robust)
    return str(spec["id"])
