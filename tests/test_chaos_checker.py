"""Invariant 6's excuses (chaos/checker.py), fed made-up faults: a reclaim that came late
because Redis could not take the crash's report (down, or full: the report waits with
its lease kept) is not held against forq, if it came within the bound of Redis's
return; any other late reclaim still is. tests/test_chaos.py runs the whole harness."""

from __future__ import annotations

from chaos.checker import Checker, Claim
from chaos.context import Context, Settings


def checker(tmp_path, faults=(), outages=()) -> Checker:
    ctx = Context(settings=Settings(), workdir=tmp_path, exec_log=tmp_path / "log",
                  redis=None, supervisors=[])  # type: ignore[arg-type]
    ctx.started = 0.0
    ctx.faults = list(faults)
    ctx.redis_outages = [list(o) for o in outages]
    return Checker(ctx, None)  # type: ignore[arg-type]


CLAIM = Claim(at=20.0, owner="host:999999999", token="1", index=0)


def test_a_crash_reported_while_redis_was_full_may_be_reclaimed_after_it_frees(tmp_path):
    c = checker(tmp_path, faults=[{"kind": "redis_full", "t": 26.44, "t_end": 28.17}])
    assert c.excuse_late(CLAIM, 26.5, 1.81, bound=1.0)  # back 0.14 s after Redis freed
    assert not c.excuse_late(CLAIM, 26.5, 3.5, bound=1.0)  # 1.8 s after: too late still
    assert len(c.late_redis) == 1


def test_a_redis_outage_excuses_as_full_does_and_nothing_else_does(tmp_path):
    c = checker(tmp_path, outages=[(20.0, 20.5)])
    assert c.excuse_late(CLAIM, 20.3, 1.0, bound=1.0)
    assert not c.excuse_late(CLAIM, 30.0, 1.81, bound=1.0)  # no spell overlaps it


def test_a_redis_that_does_not_answer_skips_a_full_spell_and_the_injector_goes_on(tmp_path):
    """A Redis just continued from a pause missed the fault's 2 s timeout on a loaded host
    and ended the injector of a 2-hour soak 71 minutes in: it is a skipped fault now."""
    import socket
    from types import SimpleNamespace

    from chaos.faults import Injector

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)  # accepts, never answers
    try:
        port = silent.getsockname()[1]
        ctx = Context(settings=Settings(), workdir=tmp_path, exec_log=tmp_path / "log",
                      redis=SimpleNamespace(url=f"redis://127.0.0.1:{port}/0"),  # type: ignore[arg-type]
                      supervisors=[])
        ctx.started = 0.0
        Injector(ctx).inject("redis_full")
        (fault,) = ctx.faults
        assert fault["kind"] == "redis_full" and "did not answer" in fault["skipped"], fault
        assert not ctx.errors
    finally:
        silent.close()


# -- the chunked kind (chaos/chunks.py): executions that share a process ------------------

OWNER = "host:999999999"  # the supervisor (its pid: 999999999)


def chunk_checker(tmp_path, lines, faults=()):
    """A checker over a made-up execution log of one chunk (pid 500) of jobs a, b, c."""
    import json

    from chaos.checker import load_execs
    from chaos.chunks import ChunkLog

    c = checker(tmp_path, faults=faults)
    log = tmp_path / "log"
    chunk = {"ev": "chunk", "chunk": "c1", "jobs": ["a", "b", "c"], "sup": "chaos-1",
             "spid": 999999999, "pid": 500, "t": 20.0}
    log.write_text("".join(json.dumps(rec) + "\n" for rec in [chunk, *lines]))
    execs, problems = load_execs(log)
    assert not problems
    c.chunks = ChunkLog.load(log, execs, [f for f in faults if f.get("chunk")])
    return c, {e.job: e for e in execs.values()}


def start(job, t):
    return {"ev": "start", "job": job, "x": f"x-{job}", "n": 1, "a": 0, "c": 0, "sup": "chaos-1",
            "spid": 999999999, "pid": 500, "t": t, "kind": "chunked", "chunk": "c1"}


def end(job, t, outcome):
    return {"ev": "end", "job": job, "x": f"x-{job}", "outcome": outcome, "t": t}


def lease(**fields):
    return Claim(at=19.9, owner=OWNER, token="7", index=0, end_at=20.3, **fields)


def record(jid, state="succeeded", **fields):
    from forq import Job

    return Job.from_record(None, {"id": jid, "queue": "chaos", "state": state, **fields}, [])


def test_a_chunk_s_unreported_job_ended_with_the_job_that_crashed_it(tmp_path):
    """A chunk reporting by its return value: job a done, not reported, when job b exits
    the process. a's lease ends in a crash that is its chunk's, not unexplained."""
    crashed = lease(end_event="reclaimed", crashed="exited with code 13")
    c, ex = chunk_checker(tmp_path, [start("a", 20.01), start("b", 20.05), end("b", 20.06, "crash")])
    ex["a"].claim = crashed
    assert c.end_cause(ex["a"], record("a")) == "crashed with its chunk"
    # the same execution in a chunk whose every job ended: nothing explains the crash
    c, ex = chunk_checker(tmp_path, [start("a", 20.01), start("b", 20.05), end("b", 20.06, "ok")])
    ex["a"].claim = crashed
    assert c.end_cause(ex["a"], record("a")).startswith("VIOLATION: unexplained crash")


def test_a_child_kill_of_a_chunk_explains_the_job_it_was_running(tmp_path):
    kill = {"kind": "child_kill", "t": 20.1, "pid": 500, "job": "a", "chunk": True,
            "sup_id": OWNER, "sup": "chaos-1", "task": "chaos.chunked"}
    lines = [start("a", 20.01), end("a", 20.02, "ok"), start("b", 20.05)]
    c, ex = chunk_checker(tmp_path, lines, faults=[kill])
    ex["b"].claim = lease(end_event="reclaimed", crashed="killed by SIGKILL")
    assert c.end_cause(ex["b"], record("b")) == "child killed"
    assert not c.killed_by_chaos(ex["a"])  # a ended (and reported) before the kill
    # a kill named after another chunk's first job did not hit this one
    c, ex = chunk_checker(tmp_path, lines, faults=[{**kill, "job": "b"}])
    ex["b"].claim = lease(end_event="reclaimed", crashed="killed by SIGKILL")
    assert c.end_cause(ex["b"], record("b")).startswith("VIOLATION")


def test_a_job_released_with_its_chunk_needs_a_fault(tmp_path):
    why = "another job of its chunk lost its lease; not run"
    stop = {"kind": "sup_stop", "t": 20.1, "t_end": 22.5, "pid": 999999999, "sup": "chaos-1"}
    c, ex = chunk_checker(tmp_path, [start("a", 20.01)], faults=[stop])
    ex["a"].claim = lease(end_event="released", end_reason=why)
    assert c.end_cause(ex["a"], record("a")) == "supervisor stopped"
    c, ex = chunk_checker(tmp_path, [start("a", 20.01)])
    ex["a"].claim = lease(end_event="released", end_reason=why)
    assert c.end_cause(ex["a"], record("a")).startswith("VIOLATION: released with its chunk")


def test_a_job_may_die_of_crashes_its_chunks_siblings_caused(tmp_path):
    """Job c never ran: each time, a job before it in its chunk exited the process (a
    chunk's crash counts a crash for every job it had not reported). Dead of crashes
    exhausted without a fault of its own is consistent then, and only then."""
    from chaos.context import Told

    def dead_c(lines):
        c, _ = chunk_checker(tmp_path, lines)
        c.ctx.told = {"c": Told("c", "chunked", "chaos.chunked", "succeed", False, 3, 1, 0.0)}
        jobs = {"c": record("c", "dead", dead_reason="crashes exhausted: 1", crashes="1",
                            max_crashes="1")}
        claims = {"c": [lease(end_event="dead", crashed="exited with code 13")]}
        return c, c.check_dead(jobs, claims)

    c, reasons = dead_c([start("a", 20.01), end("a", 20.02, "crash")])
    assert c.inv[5].ok, c.inv[5].violations
    assert reasons == {"crashes exhausted (chunk siblings)": 1}
    c, reasons = dead_c([start("a", 20.01), end("a", 20.02, "ok")])
    assert not c.inv[5].ok and "no fault or handler crash" in c.inv[5].violations[0]
