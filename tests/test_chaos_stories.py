"""Invariant 13's pieces (chaos/stories.py), fed made-up records and events: each kind
of disagreement between the events, the records, the on_dead jobs and the debounced
calls is named. tests/test_chaos.py runs the whole harness."""

from __future__ import annotations

import json

from chaos import stories
from forq import Job, QueueEvent


def job(jid: str, history: list[dict], state: str = "succeeded", **fields: str) -> Job:
    record = {"id": jid, "queue": "chaos", "state": state, **fields}
    return Job.from_record(None, record, [json.dumps(h) for h in history])


def events(jid: str, *kinds: str, **fields: str) -> list[QueueEvent]:
    out = []
    for n, kind in enumerate(kinds):
        extra = {"attempt": "1"} if kind == "failed" else {}
        out.append(QueueEvent(f"1000-{n}", "chaos", kind, jid, "t", None,
                              fields.get("reason") if kind == "dead" else None, extra))
    return out


HISTORY = [{"event": "enqueued", "at": 1000}, {"event": "claimed", "at": 1001, "token": 1},
           {"event": "succeeded", "at": 1002}]


def test_a_story_that_matches_its_record_passes():
    ok = job("j1", HISTORY, attempts="1")
    assert stories.story_problems(ok, events("j1", "enqueued", "started", "succeeded")) == []
    dead = job("j2", [*HISTORY[:2], {"event": "dead", "at": 1002}], state="dead",
               attempts="1", dead_reason="boom")
    assert stories.story_problems(dead, events("j2", "enqueued", "started", "failed", "dead",
                                                reason="boom")) == []


def test_each_disagreement_is_named():
    ok = job("j1", HISTORY, attempts="1")
    cases = {
        ("enqueued", "started"): "ends [] in the events, record succeeded",
        ("started", "succeeded"): "0 'enqueued' events",
        ("enqueued", "started", "started", "succeeded"): "2 'started' events, 1 claims",
        ("enqueued", "started", "succeeded", "succeeded"): "ends ['succeeded', 'succeeded']",
        ("enqueued", "started", "failed", "succeeded"): "1 failed attempts in the events",
        ("enqueued", "succeeded", "started"): "'started' after its end",
    }
    for kinds, problem in cases.items():
        found = stories.story_problems(ok, events("j1", *kinds))
        assert any(problem in p for p in found), (kinds, found)
    dead = job("j2", [], state="dead", attempts="1", dead_reason="the real reason")
    found = stories.story_problems(dead, events("j2", "enqueued", "failed", "dead",
                                                reason="another"))
    assert any("dead with 'another'" in p for p in found), found


def test_on_dead_jobs_are_checked_against_the_deaths():
    dead = job("d1", [], state="dead", dead_reason="boom")
    notice = job("d1-on-dead-1", [], kwargs=json.dumps({"job_id": "d1", "reason": "boom"}),
                 on_dead_of="d1")
    assert stories.on_dead_problems({"d1": dead, "d1-on-dead-1": notice}) == []
    assert stories.on_dead_problems({"d1": dead}) == ["d1: dead (boom), no on_dead job"]
    wrong = job("d1-on-dead-1", [], kwargs=json.dumps({"job_id": "d1", "reason": "x"}),
                on_dead_of="d1")
    assert "reason 'x'" in stories.on_dead_problems({"d1": dead, "d1-on-dead-1": wrong})[0]
    dead_notice = job("d1-on-dead-1", [], state="dead", dead_reason="no handler",
                      on_dead_of="d1", kwargs=json.dumps({"job_id": "d1", "reason": "boom"}))
    loop = job("d1-on-dead-1-on-dead-1", [], on_dead_of="d1-on-dead-1")
    found = stories.on_dead_problems({"d1": dead, "d1-on-dead-1": dead_notice,
                                      "d1-on-dead-1-on-dead-1": loop})
    assert any("set off another" in p for p in found), found
    alive = job("a1", [])
    stray = job("a1-on-dead-1", [], on_dead_of="a1")
    assert stories.on_dead_problems({"a1": alive, "a1-on-dead-1": stray}) == \
        ["a1-on-dead-1: on_dead job of a1, which is not dead"]


def test_a_debounced_job_runs_the_last_calls_arguments():
    calls = [["k", 1, "j1", "scheduled"], ["k", 2, "j1", "replaced"], ["k", 3, "j3", "pending"]]
    ran = {"j1": job("j1", [], kwargs=json.dumps({"v": 2}), result=json.dumps({"v": 2})),
           "j3": job("j3", [], kwargs=json.dumps({"v": 3}), result=json.dumps({"v": 3}))}
    assert stories.debounce_problems(calls, ran) == []
    stale = dict(ran, j1=job("j1", [], kwargs=json.dumps({"v": 2}), result=json.dumps({"v": 1})))
    assert stories.debounce_problems(calls, stale) == \
        ["j1: ran with v=1, the last call had v=2"]


def test_replay_follows_a_replaced_job_and_names_one_replaced_while_running():
    from chaos.checker import Checker

    # history times are Redis ms, as the scripts write them
    h = [{"event": "enqueued", "at": 1_000_000, "run_at": 1_000_500},
         {"event": "replaced", "at": 1_000_200, "run_at": 1_000_700},
         {"event": "replaced", "at": 1_000_300},
         {"event": "claimed", "at": 1_001_000, "token": 1},
         {"event": "succeeded", "at": 1_002_000}]
    assert Checker.replay(job("j1", h)) == []
    late = [*h[:4], {"event": "replaced", "at": 1_001_500}, h[4]]
    assert Checker.replay(job("j1", late)) == ["replaced while active"]
    early = [*h[:3], {"event": "claimed", "at": 1_000_600, "token": 1}, h[4]]
    assert Checker.replay(job("j1", early)) == ["claimed 100 ms before its run-at"]


def test_a_job_older_than_the_streams_oldest_event_is_not_checked():
    class Inv:
        def __init__(self) -> None:
            self.failed: list[str] = []
            self.notes: list[str] = []

        def fail(self, message: str) -> None:
            self.failed.append(message)

    old = job("j1", HISTORY, attempts="1", enqueued_at="1000")
    inv = Inv()
    stories.check(inv, {"j1": old}, {"j1": events("j1", "succeeded")}, [],
                  {"chaos": 2.0})  # kept from 2 s: j1 was enqueued at 1 s
    assert inv.failed == [] and "1 jobs enqueued before" in inv.notes[0]
    inv = Inv()
    stories.check(inv, {"j1": old}, {"j1": events("j1", "succeeded")}, [], {"chaos": 0.5})
    assert any("0 'enqueued' events" in f for f in inv.failed)
