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
