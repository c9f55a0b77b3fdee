"""A FastAPI app that enqueues with forq's AsyncQueue, after its database commits.

    FORQ_REDIS_URL=redis://127.0.0.1:6379/0 uvicorn app:app          # the web app
    PYTHONPATH=. forq run --config forq.toml                          # the jobs
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException

from forq import AsyncQueue, JobNotFound

import outbox

DB_PATH = os.environ.get("SIGNUP_DB", "signup.sqlite3")
RELAY_EVERY = float(os.environ.get("SIGNUP_RELAY_EVERY", "5"))
queue = AsyncQueue(os.environ.get("SIGNUP_QUEUE", "signup"))  # FORQ_REDIS_URL, else local
db: sqlite3.Connection = outbox.connect(DB_PATH)


async def relay_forever() -> None:
    while True:
        await asyncio.sleep(RELAY_EVERY)
        await outbox.relay(db, queue, older_than=RELAY_EVERY)


@contextlib.asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    await outbox.relay(db, queue, older_than=0)  # what a previous run left behind
    relay = asyncio.create_task(relay_forever())
    yield
    relay.cancel()
    await queue.aclose()  # the queue's connection pool lives as long as the app


app = FastAPI(lifespan=lifespan)


@app.post("/signup")
async def signup(email: str) -> dict[str, str]:
    try:
        db.execute("BEGIN")
        db.execute("INSERT INTO users VALUES (?)", (email,))
        job_id = outbox.add(db, "welcome.send", email)
        db.execute("COMMIT")
    except sqlite3.IntegrityError:
        db.execute("ROLLBACK")  # no user, no outbox row: no job
        raise HTTPException(409, f"{email} has signed up already") from None
    await outbox.send(db, queue, job_id)
    return {"job": job_id}


@app.get("/jobs/{job_id}")
async def job_status(job_id: str) -> dict[str, Any]:
    try:
        job = await queue.get(job_id)
    except JobNotFound:
        raise HTTPException(404, f"no job {job_id}") from None
    return {"state": job.state, "result": job.result}
