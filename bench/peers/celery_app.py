"""The Celery app: Redis broker and result backend, configured for at-least-once as
Celery's docs advise for jobs that must survive a worker crash (acks_late with
reject_on_worker_lost). Broker and backend URLs come from the environment."""

from __future__ import annotations

import os

import peer_tasks
from celery import Celery

app = Celery("bench", broker=os.environ.get("BENCH_CELERY_BROKER", "redis://127.0.0.1:6379/2"),
             backend=os.environ.get("BENCH_CELERY_BACKEND", "redis://127.0.0.1:6379/3"))
app.conf.update(
    task_default_queue="bench",
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=True,
)


@app.task(name="bench.noop")
def noop(*args, **kwargs):
    return peer_tasks.noop(*args, **kwargs)


@app.task(name="bench.stamp")
def stamp():
    return peer_tasks.stamp()


@app.task(name="bench.marked_sleep")
def marked_sleep(path, seconds=20.0):
    return peer_tasks.marked_sleep(path, seconds)
