"""Chunked handlers (`task(chunk=N)`) for tests/test_chunks.py.

Each appends a line ``<pid> <job id> <what>`` to the file named by its jobs' first
argument, outside Redis, so a test sees which process ran which job and how often.
"""

from __future__ import annotations

import json
import os
import signal
import time

from forq import ChunkJob, NonRetryable, Retry, task


def note(job: ChunkJob, what: str) -> None:
    with open(job.args[0], "a") as f:
        f.write(f"{os.getpid()} {job.id} {what}\n")


@task("chunks.record", chunk=8)
def record(jobs: list[ChunkJob]) -> None:
    """Each job succeeds with its second argument; None settles them all."""
    for job in jobs:
        note(job, "ran")
    return None


@task("chunks.mixed", chunk=8)
def mixed(jobs: list[ChunkJob]) -> list[object]:
    """A list of outcomes: "ok" → its result, "fail" → ValueError (retried per its own
    max_attempts), "fatal" → NonRetryable (dead at once)."""
    outcomes: list[object] = []
    for job in jobs:
        note(job, "ran")
        kind = job.args[1]
        outcomes.append({"ok": f"done {job.id}", "fail": ValueError(f"boom {job.id}"),
                         "fatal": NonRetryable(f"never {job.id}")}[kind])
    return outcomes


@task("chunks.crash", chunk=8)
def crash(jobs: list[ChunkJob]) -> None:
    """Reports each job as it goes; a job whose second argument is "crash" kills the
    whole process (SIGKILL, on its first run only) before it is reported."""
    for job in jobs:
        note(job, "ran")
        if job.args[1] == "crash" and job.crashes == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        job.ok(job.id)


@task("chunks.exit_after_first", chunk=8)
def exit_after_first(jobs: list[ChunkJob]) -> None:
    """Reports the first job, then `os._exit(3)` on its first run."""
    for i, job in enumerate(jobs):
        note(job, "ran")
        job.ok("first" if i == 0 else "later")
        if i == 0 and job.crashes == 0 and len(jobs) > 1:
            os._exit(3)


@task("chunks.stuck", chunk=8)
def stuck(jobs: list[ChunkJob]) -> None:
    """Reports the first job, then never ends (its time limit stops it)."""
    jobs[0].ok("before the limit")
    note(jobs[0], "ran")
    while True:
        time.sleep(1)


def _raw(line: dict) -> None:
    data = (json.dumps(line) + "\n").encode()
    while data:
        data = data[os.write(3, data):]


@task("chunks.hostile", chunk=8)
def hostile(jobs: list[ChunkJob]) -> None:
    """On its first run (no crash yet) reports the first job honestly, then lies as its
    second argument says: "stranger" (a result for a job not in its chunk), "twice"
    (the first job again), "extra" (every job, then one more result). Later runs are
    honest."""
    if jobs[0].crashes or any(job.crashes for job in jobs):
        for job in jobs:
            note(job, "ran")
            job.ok("honest")
        return
    how = jobs[0].args[1]
    jobs[0].ok("first")
    note(jobs[0], "ran")
    if how == "stranger":
        _raw({"t": "result", "job": "someone-else", "ok": True, "result": 1})
    elif how == "twice":
        _raw({"t": "result", "job": jobs[0].id, "ok": True, "result": 2})
    elif how == "extra":
        for job in jobs[1:]:
            job.ok("ok")
        _raw({"t": "result", "job": jobs[-1].id, "ok": True, "result": 3})
    while True:  # the parent kills it for what it wrote
        time.sleep(1)


@task("chunks.slow", chunk=8)
def slow(jobs: list[ChunkJob]) -> None:
    """Runs for its first job's second argument (seconds), then all succeed."""
    for job in jobs:
        note(job, "ran")
    time.sleep(float(jobs[0].args[1]))


@task("chunks.wait_file", chunk=8)
def wait_file(jobs: list[ChunkJob]) -> None:
    """Reports the first job, then waits until the file named by the first job's second
    argument exists; every job succeeds."""
    jobs[0].ok("first")
    note(jobs[0], "ran")
    gate = jobs[0].args[1]
    while not os.path.exists(gate):
        time.sleep(0.02)
    for job in jobs[1:]:
        note(job, "ran")



@task("chunks.snooze", chunk=8)
def snooze(jobs: list[ChunkJob]) -> None:
    """Puts each job off once (`Retry`, no attempt counted), then succeeds with the
    number of snoozes it saw."""
    for job in jobs:
        note(job, f"snoozes={job.snoozes}")
        if job.snoozes == 0:
            job.fail(Retry(in_=0.05, reason="not yet"))
        else:
            job.ok(job.snoozes)
