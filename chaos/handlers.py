"""The chaos job handlers, preloaded by every chaos supervisor.

Every execution appends two JSON lines to the file named by ``FORQ_CHAOS_EXEC_LOG``,
opened with O_APPEND on each write (a child holds no inherited descriptor, and a line
written survives any Redis fault and any kill that comes after it):

    {"ev": "start", "job", "x" (execution id), "n" (execution number as the job sees
     it: attempts + crashes + 1), "a", "c", "sup" (supervisor name), "spid" (its pid),
     "pid", "t" (wall clock), "kind"}
    {"ev": "end", "job", "x", "outcome": "ok" | "raise" | "fatal" | "crash" | "snooze" |
     "throttle", "t"}

A chunked handler (`chaos.chunked`, `task(chunk=N)`) writes one more line when its
chunk starts, and each job's start line names that chunk:

    {"ev": "chunk", "chunk" (chunk id), "jobs" (its job ids, in order), "sup", "spid",
     "pid", "t"}

A successful handler returns ``{"x": <execution id>}``, so the result stored in
Redis names the one execution whose acknowledgement won.

``FORQ_CHAOS_BREAK`` (comma-separated; read only here) builds a deliberately broken system for the
checker's self-test:

* ``double-run``: an idempotent job's execution is recorded twice, as if a stale
  child had completed it again.
* ``chunk-record``: a chunk is recorded as one execution (its first job's) and every
  job of it reports that execution's id, as if a chunk were one job.
* ``no-fencing`` is built into the supervisor itself, not here: `chaos.broken`.
"""

from __future__ import annotations

import json
import os
import time

from forq import ChunkJob, NonRetryable, Retry, current, task

LOG_ENV = "FORQ_CHAOS_EXEC_LOG"
SUPERVISOR_ENV = "FORQ_CHAOS_SUPERVISOR"
BREAK_ENV = "FORQ_CHAOS_BREAK"


def _breaks() -> list[str]:
    return os.environ.get(BREAK_ENV, "").split(",")


def _record(fields: dict) -> None:
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    line = (json.dumps(fields, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write of a short line: atomic with O_APPEND
    finally:
        os.close(fd)


def _supervisor_pid() -> int:
    """The supervisor that runs this job: the parent, or the parent's parent when the
    parent is the supervisor's fork server; a job in namespaces of its own sees neither,
    and reads what chaos put in the supervisor's environment."""
    if os.getpid() == 1:
        return int(os.environ.get("CHAOS_SUPERVISOR_PID", "0"))
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as f:
            cmdline = f.read()
        if cmdline.startswith(b"forq: fork server") or b"forq.supervisor.fork.server" in cmdline:
            with open(f"/proc/{parent}/stat", "rb") as f:
                stat = f.read()
            return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return parent


def _start(kind: str) -> tuple[str, object]:
    ctx = current()
    return _start_line(kind, ctx.id, ctx.attempts, ctx.crashes), ctx


def _start_line(kind: str, job: str, attempts: int, crashes: int, **extra: object) -> str:
    x = f"{os.getpid()}-{time.time_ns()}"
    _record({"ev": "start", "job": job, "x": x, "n": attempts + crashes + 1,
             "a": attempts, "c": crashes, "sup": os.environ.get(SUPERVISOR_ENV, ""),
             "spid": _supervisor_pid(), "pid": os.getpid(), "t": time.time(), "kind": kind,
             **extra})
    return x


def _end(job: str, x: str, outcome: str) -> None:
    _record({"ev": "end", "job": job, "x": x, "outcome": outcome, "t": time.time()})


def _execute(kind: str, body, *, fail_times: int = 0, crash_times: int = 0,
             fatal: bool = False, idempotent: bool = False, garbage: bool = False) -> dict:
    x, ctx = _start(kind)
    if crash_times and ctx.crashes < crash_times:
        _end(ctx.id, x, "crash")
        if garbage:  # a malformed message on the result pipe: a crash of this job only
            os.write(3, b'{"t": "result", "ok": "surely"}\n\xff\x00')
            os._exit(0)
        os._exit(13)  # no result: the parent reports a crash
    if fatal:
        _end(ctx.id, x, "fatal")
        raise NonRetryable("chaos: this job can never work")
    if fail_times and ctx.attempts < fail_times:
        _end(ctx.id, x, "raise")
        raise RuntimeError(f"chaos: attempt {ctx.attempts + 1} fails on purpose")
    body()
    _end(ctx.id, x, "ok")
    if idempotent and "double-run" in _breaks():
        # the broken build: a second, unfenced completion of the same job
        x2, _ = _start(kind)
        _end(ctx.id, x2, "ok")
    return {"x": x}


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1


@task("chaos.quick")
def quick(ms: float = 5, fail_times: int = 0, crash_times: int = 0, idem: bool = False):
    return _execute("quick", lambda: time.sleep(ms / 1000), fail_times=fail_times,
                    crash_times=crash_times, idempotent=idem)


@task("chaos.moved")
def moved(ms: float = 5):
    """A delayed job the operator thread changes while it waits (chaos/changes.py)."""
    return _execute("moved", lambda: time.sleep(ms / 1000))


@task("chaos.slow")
def slow(ms: float = 1000, fail_times: int = 0, crash_times: int = 0, idem: bool = False):
    return _execute("slow", lambda: time.sleep(ms / 1000), fail_times=fail_times,
                    crash_times=crash_times, idempotent=idem)


@task("chaos.cpu")
def cpu(ms: float = 100, fail_times: int = 0, crash_times: int = 0, idem: bool = False):
    return _execute("cpu", lambda: _burn(ms / 1000), fail_times=fail_times,
                    crash_times=crash_times, idempotent=idem)


@task("chaos.flaky")
def flaky(fail_times: int = 1, ms: float = 5, idem: bool = False):
    return _execute("flaky", lambda: time.sleep(ms / 1000), fail_times=fail_times,
                    idempotent=idem)


@task("chaos.crashy")
def crashy(crash_times: int = 1, ms: float = 5, idem: bool = False):
    return _execute("crashy", lambda: time.sleep(ms / 1000), crash_times=crash_times,
                    idempotent=idem)


@task("chaos.idem", idempotent=True)
def idem(ms: float = 200, crash_times: int = 0):
    return _execute("idem", lambda: time.sleep(ms / 1000), crash_times=crash_times,
                    idempotent=True)


@task("chaos.fatal")
def fatal():
    return _execute("fatal", lambda: None, fatal=True)


def _escape() -> None:
    """Leave a process behind, out of the job's process group (double fork, setsid)."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["chaos-escapee", "1"])
        os._exit(0)


def _flood() -> None:
    line = b"chaos flood " + b"z" * 1000 + b"\n"
    for _ in range(256):  # 256 KiB, over max_output_bytes
        os.write(1, line)


@task("chaos.hostile")
def hostile(attack: str = "garbage", crash_times: int = 1):
    """A job that does harm: leaves an escapee, floods its output, or writes garbage to
    its result pipe (`crash_times` times, then succeeds)."""
    body = {"escapee": _escape, "flood": _flood}.get(attack, lambda: None)
    return _execute("hostile", body, crash_times=crash_times if attack == "garbage" else 0,
                    garbage=True)


STEPS = ("a", "b", "c")


@task("chaos.steps")
def steps(crash_times: int = 0, ms: float = 5):
    """Three durable steps, each returning "<execution id>/<name>": crashes (exits)
    between the second and the third `crash_times` times. The result lists what each
    step returned, so the checker can tell the recorded results from re-runs."""
    x, ctx = _start("steps")
    seen = []
    for name in STEPS:
        seen.append(current().step(name, lambda n=name: f"{x}/{n}"))
        if name == "b" and crash_times and ctx.crashes < crash_times:
            _end(ctx.id, x, "crash")
            os._exit(13)
        time.sleep(ms / 1000)
    _end(ctx.id, x, "ok")
    return {"x": x, "steps": seen}


@task("chaos.debounced")
def debounced(v: int, ms: float = 20):
    """Enqueued with a key and `debounce`: one run per burst of calls, with the last
    call's `v`, which the result names for the checker (invariant 12)."""
    result = _execute("debounced", lambda: time.sleep(ms / 1000))
    return {**result, "v": v}


@task("chaos.on_dead")
def on_dead(job_id: str, task: str, reason: str):
    """The chaos queues' on_dead task (`[[queue]] on_dead`): enqueued by the transition
    that killed `job_id`; records its run like every chaos job, and names the dead job."""
    result = _execute("on-dead", lambda: None)
    return {**result, "dead": job_id}


@task("chaos.batch_callback")
def batch_callback(batch_id: str, role: str = "on_complete", crash_times: int = 0):
    """A batch's on_complete or on_success callback: records its run like every chaos job
    (the checker compares it with the batch's members), crashing `crash_times` times first
    so that a callback's re-run is exercised too. Its result holds the members' results
    it read (`current().parent_results()`: members on the other queue too)."""
    read: dict = {}
    result = _execute("batch-cb", lambda: read.update(parents=current().parent_results()),
                      crash_times=crash_times)
    return {**result, **read}


@task("chaos.snoozy")
def snoozy(snooze_times: int = 1, ms: float = 50):
    """Puts itself off `snooze_times` times (`raise Retry(in_=ms)`, no attempt counted),
    then succeeds; past its max_snoozes it is dead instead."""
    x, ctx = _start("snoozy")
    if ctx.snoozes < snooze_times:
        _end(ctx.id, x, "snooze")
        raise Retry(in_=ms / 1000, reason=f"chaos: snooze {ctx.snoozes + 1}")
    time.sleep(0.005)
    _end(ctx.id, x, "ok")
    return {"x": x}


@task("chaos.throttler")
def throttler(scope: str = "group", ms: float = 100, throttle_times: int = 1):
    """Throttles its group (or the whole queue) for `ms` on its first `throttle_times`
    runs (the job goes back to wait), then succeeds."""
    x, ctx = _start("throttler")
    if ctx.snoozes < throttle_times:
        _end(ctx.id, x, "throttle")
        current().throttle(ms / 1000, group=scope == "group", reason="chaos: 429")
    time.sleep(0.005)
    _end(ctx.id, x, "ok")
    return {"x": x}


@task("chaos.dependent")
def dependent(ms: float = 5):
    """A job with depends_on: returns the results of its parents it read, for the checker
    to compare with what Redis holds."""
    read: dict = {}
    result = _execute("dependent", lambda: (read.update(parents=current().parent_results()),
                                            time.sleep(ms / 1000)))
    return {**result, **read}


@task("chaos.batch_opener")
def batch_opener(inner: list, crash_times: int = 0):
    """A batch member that opens a batch of its own (`current().batch`, with an
    on_complete): it ends in its batch only once that batch is done. It crashes after
    opening it `crash_times` times: the batch goes with the result, so a crashed run
    opened nothing, and the next run opens it."""
    x, ctx = _start("batch-opener")
    bid = current().batch(inner, on_complete={"task": "chaos.batch_callback",
                                              "kwargs": {"role": "on_complete"}})
    if crash_times and ctx.crashes < crash_times:
        _end(ctx.id, x, "crash")
        os._exit(13)
    _end(ctx.id, x, "ok")
    return {"x": x, "batch": bid}


@task("chaos.memhog")
def memhog(megabytes: int = 1024, step: int = 16):
    """Allocate (touching every page) until the supervisor kills it for its memory."""

    def grow() -> None:
        blocks = []
        for _ in range(0, megabytes, step):
            blocks.append(b"\x01" * (step << 20))
            time.sleep(0.005)

    return _execute("memhog", grow)


@task("chaos.chunked", chunk=8)
def chunked(jobs: list[ChunkJob]) -> list | None:
    """Up to 8 jobs in one child, each an execution of its own: its start line names the
    chunk (whose own line lists its jobs), its end line is written before its report.
    A job sleeps `ms`; fails its first `fail_times` attempts (`job.fail`); puts itself off
    once for `snooze_ms` (`Retry`: `job.snoozes` counts it); fails for good if `fatal`;
    exits the whole process (`os._exit(13)`, the jobs after it unreported) on its first
    `crash_times` runs. A chunk whose first job says `ret` reports its
    successes by its return value, all at the end (their end lines just before it): a
    crash or kill before then leaves them unreported, each an execution without an end."""
    spid, pid, sup = _supervisor_pid(), os.getpid(), os.environ.get(SUPERVISOR_ENV, "")
    cid = f"c{pid}-{time.time_ns()}"
    _record({"ev": "chunk", "chunk": cid, "jobs": [job.id for job in jobs], "sup": sup,
             "spid": spid, "pid": pid, "t": time.time()})
    by_return = bool(jobs[0].kwargs.get("ret"))
    one = "chunk-record" in _breaks()  # the broken build: the chunk recorded as one job
    outcomes: list = []
    done: list[tuple[str, str]] = []  # (job, x) completed, reported by the return value
    x = ""
    for i, job in enumerate(jobs):
        kw = job.kwargs
        recorded = not one or i == 0
        if recorded:
            x = _start_line("chunked", job.id, job.attempts, job.crashes, chunk=cid)
        time.sleep(float(kw.get("ms", 5)) / 1000)
        outcome = ("crash" if job.crashes < int(kw.get("crash_times", 0)) else
                   "fatal" if kw.get("fatal") else
                   "snooze" if kw.get("snooze_ms") and job.snoozes < 1 else
                   "raise" if job.attempts < int(kw.get("fail_times", 0)) else "ok")
        outcomes.append({"x": x})
        if outcome == "ok" and by_return:
            if recorded:
                done.append((job.id, x))
            continue
        if recorded:
            _end(job.id, x, outcome)
        if outcome == "crash":
            os._exit(13)  # the chunk's process: every job not reported is retried
        if outcome == "fatal":
            job.fail(NonRetryable("chaos: this chunked job can never work"))
        elif outcome == "snooze":
            job.fail(Retry(in_=float(kw["snooze_ms"]) / 1000, reason="chaos: chunked snooze"))
        elif outcome == "raise":
            job.fail(RuntimeError(f"chaos: attempt {job.attempts + 1} fails on purpose"))
        else:
            job.ok({"x": x})
    for job_id, done_x in done:
        _end(job_id, done_x, "ok")
    return outcomes if by_return else None
