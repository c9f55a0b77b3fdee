"""Enqueue after commit, the general recipe: an outbox table and a relay.

The intent to run a job is written in the *same* database transaction as the change
that calls for it, as an outbox row whose id is the job's id. After the commit the app
enqueues it and deletes the row; a relay re-sends rows that stayed behind (the process
died, or Redis was down, between commit and enqueue). Re-sending is safe because the row
id is the job id: an enqueue with an id that already exists is answered "duplicate" and
adds nothing, so a job runs once whether the app or the relay got it through.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from forq import AsyncQueue
from forq.payload import new_job_id

SCHEMA = """
CREATE TABLE IF NOT EXISTS users (email TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS outbox (
    job_id TEXT PRIMARY KEY, task TEXT NOT NULL, args TEXT NOT NULL, created REAL NOT NULL
);
"""


def connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)  # explicit BEGIN/COMMIT below
    db.executescript(SCHEMA)
    return db


def add(db: sqlite3.Connection, task: str, *args: Any) -> str:
    """Record a job to enqueue, inside the caller's open transaction; returns its id."""
    job_id = new_job_id()
    db.execute("INSERT INTO outbox VALUES (?, ?, ?, ?)",
               (job_id, task, json.dumps(args), time.time()))
    return job_id


async def send(db: sqlite3.Connection, queue: AsyncQueue, job_id: str) -> None:
    """Enqueue one outbox row (after its commit), then forget it."""
    row = db.execute("SELECT task, args FROM outbox WHERE job_id = ?", (job_id,)).fetchone()
    if row is None:
        return  # the relay got there first
    await queue.enqueue(row[0], *json.loads(row[1]), job_id=job_id)
    db.execute("DELETE FROM outbox WHERE job_id = ?", (job_id,))


async def relay(db: sqlite3.Connection, queue: AsyncQueue, older_than: float = 5.0) -> int:
    """Send the rows left behind for longer than `older_than` seconds; how many."""
    rows = db.execute("SELECT job_id FROM outbox WHERE created < ?",
                      (time.time() - older_than,)).fetchall()
    for (job_id,) in rows:
        await send(db, queue, job_id)
    return len(rows)
