"""The sans-IO layer (`forq.store.transitions`) against the scripts' own headers, in-process.

Each call builder must send as many KEYS as its script's header names, and at least
the fixed ARGV it names (the variadic tail, ``ARGV[n..]``, may be empty). The parsers
are checked on replies of the shapes the headers document.
"""

from __future__ import annotations

import json
import re

import pytest

from forq.store import control, cron, finder
from forq.store import transitions as tr
from forq.store.keys import QueueKeys
from forq.store.scripts import source

KEYS = QueueKeys("calls")

CALLS = {
    "enqueue": tr.enqueue_calls(KEYS, [{"id": "a", "task": "t"}])[0],
    "claim": tr.claim_call(KEYS, "sup", 3, 1000, ""),
    "extend": tr.extend_call(KEYS, [("a", "1"), ("b", "2")], 1000),
    "ack": tr.ack_call(KEYS, "a", "1", "null", [{"id": "a-1"}]),
    "fail": tr.fail_call(KEYS, "a", "1", {"message": "x"}, "fatal", jitter=0.5),
    "expire": tr.expire_call(KEYS, "a", "1", "SIGKILL"),
    "reclaim": tr.reclaim_call(KEYS, "sup", 3, 10),
    "release": tr.release_call(KEYS, "a", "1"),
    "cancel": tr.cancel_call(KEYS, "a"),
    "requeue_dead": tr.requeue_dead_call(KEYS, ["a", "b"], 100),
    "purge_dead": tr.purge_dead_call(KEYS, None, 100),
    "output": tr.output_call(KEYS, "a", "1", "printed\n"),
    "pause": tr.pause_call(KEYS),
    "resume": tr.resume_call(KEYS),
    "sweep_expired": tr.sweep_expired_call(KEYS, "sup", 10),
    "progress": tr.progress_call(KEYS, [("a", "1", 0.5, "half"), ("b", "2", 1, "")]),
    "step": tr.step_call(KEYS, "a", "1", "charge-card", '{"id":7}'),
    "batch": tr.batch_call(KEYS, "b", {"total": 1, "members": [["calls", "b-1"]]},
                           [{"id": "b-1", "task": "t"}]),
    "batch_relay": tr.batch_relay_call(KEYS, [("b", "b-1", True)]),
    "promote": tr.promote_call(KEYS, "a"),
    "reschedule": tr.reschedule_call(KEYS, "a", 30_000, relative=True),
    "set_priority": tr.set_priority_call(KEYS, "a", 5),
    "find": finder.find_call(KEYS, finder.JobFilter("dead", task="t", since="1h"), "12|a"),
    "schedule_define": cron.schedule_define_call("add", "nightly", '{"cron": "@daily"}'),
    "schedule_fired": cron.schedule_fired_call("nightly", "tick", 1700000000.0, "job-1"),
    "throttle": control.throttle_call(KEYS, "a", "1", 60_000, False, "429"),
    "set_throttle": control.set_throttle_call(KEYS, 60_000, "g"),
    "parents": control.parents_call(KEYS, "a", "1", 0, 500, 1 << 20),
    "resume_task": control.resume_task_call(KEYS, "t"),
    "trim": control.trim_call(KEYS, 100),
}
GLOBAL = {"schedule_define", "schedule_fired"}  # one global key each, not a queue's


def _header_counts(name: str) -> tuple[int, int, int, bool]:
    """(KEYS named, ARGV required, ARGV named, has a variadic ARGV tail) from the
    script header; an ARGV marked "(optional)" may be left off the end of a call."""
    header = source(name).split("]]", 1)[0]
    keys = {int(n) for n in re.findall(r"^\s*KEYS\[(\d+)\]", header, re.MULTILINE)}
    named = dict(re.findall(r"^\s*ARGV\[(\d+)\]\s+(.*)$", header, re.MULTILINE))
    fixed = {int(n) for n in named}
    required = {int(n) for n, text in named.items() if not text.startswith("(optional)")}
    variadic = bool(re.search(r"ARGV\[\d+\.\.", header))
    return max(keys), max(required), max(fixed), variadic


def test_every_transition_has_a_call_builder():
    assert set(CALLS) == set(tr.TRANSITIONS)
    assert all(call.script == name for name, call in CALLS.items())


@pytest.mark.parametrize("name", tr.TRANSITIONS)
def test_call_matches_its_script_header(name):
    keys, required, fixed, variadic = _header_counts(name)
    call = CALLS[name]
    assert len(call.keys) == keys, f"{name}: header names {keys} KEYS"
    assert (len(call.args) >= fixed if variadic else required <= len(call.args) <= fixed), \
        (f"{name}: header names {required} required and {fixed} ARGV in all (variadic: "
         f"{variadic}), call has {call.args}")
    if name in GLOBAL:
        assert len(call.keys) == 1  # one cluster slot
    else:
        assert all(key.startswith(KEYS.prefix) for key in call.keys)  # one cluster slot


def test_enqueue_calls_are_batched():
    specs = [{"id": str(i), "task": "t"} for i in range(tr.ENQUEUE_BATCH * 2 + 1)]
    calls = tr.enqueue_calls(KEYS, specs)
    # six arguments a job (lua/enqueue.lua): id, task, args, kwargs, priority, options
    assert [(len(c.args) - 2) / 6 for c in calls] == [tr.ENQUEUE_BATCH, tr.ENQUEUE_BATCH, 1]
    assert calls[2].args[2:] == (str(2 * tr.ENQUEUE_BATCH), "t", "[]", "{}", "0", "")


def test_an_enqueue_call_sends_a_plain_job_by_position_and_the_rest_as_json():
    plain = {"id": "a", "task": "t", "args": "[1]", "kwargs": "{}", "priority": -3}
    delayed = {"id": "b", "task": "t", "args": "[]", "kwargs": "{}", "priority": 0,
               "delay_ms": 5000, "group": "g"}
    (call,) = tr.enqueue_calls(KEYS, [plain, delayed])
    assert call.args[2:8] == ("a", "t", "[1]", "{}", "-3", "")
    assert call.args[8:13] == ("b", "t", "[]", "{}", "0")
    assert json.loads(call.args[13]) == {"delay_ms": 5000, "group": "g"}


def test_parsers_read_the_documented_replies():
    # only the jobs that did not become pending under their own id are in the reply
    assert tr.parse_enqueue([2, "h", "duplicate", 0, 3, "c", "scheduled", 9],
                            ["a", "b", "c"]) == [
        ("a", "pending"), ("h", "duplicate"), ("c", "scheduled")]
    assert tr.parse_enqueue([], ["a", "b"]) == [("a", "pending"), ("b", "pending")]
    claim = tr.parse_claim([-1, 0, 4, 1, 1700,
                            ["id", "a", "queue", "calls", "token", "7", "attempts", "2"]])
    assert (claim.next_due_ms, claim.pending_left, claim.held_by_max_in_flight) == (-1, 4, True)
    assert [(lease.id, lease.token, lease.job.attempts) for lease in claim.leases] == [("a", "7", 2)]
    assert tr.parse_extend([["a"], [], 99]) == tr.ExtendResult(["a"], [], 99)
    assert tr.parse_reclaim([1, 0, 2, "a", "b", "c"]).ids == ["a", "b", "c"]
    assert tr.parse_fail(["retry", 123, 2]) == tr.FailOutcome("retry", 123, 2)
    assert tr.parse_dead_batch([2, "gone"]) == (2, ["gone"])
    assert tr.parse_lease_reply("lost") == "lost"
    assert (tr.parse_changed(1), tr.parse_changed(0)) == (True, False)
    assert tr.parse_sweep([2, "a", "b"]) == ["a", "b"]
    assert tr.parse_progress(["ok", "lost"]) == ["ok", "lost"]
    assert tr.parse_batch(["opened", 3]) == ("opened", 3)
    assert tr.parse_batch_relay(2) == 2
    assert tr.parse_changed_job(["promoted", "pending"]) == ("promoted", "pending", "", 0)
    assert tr.parse_changed_job(["rescheduled", "scheduled", 99]).run_at_ms == 99
    assert tr.parse_changed_job(["refused", "active", "state"]).why == "state"
    assert tr.parse_changed_job(["refused", "dead"]) == ("refused", "dead", "state", 0)
    assert tr.parse_changed_job(["missing", ""]).outcome == "missing"
    records, cursor, examined, gone = finder.parse_find(
        ["5", "b", 0, 3, 1, ["a", "4", "t.x", None, "1000"]])
    assert records == [{"id": "a", "score": "4", "task": "t.x", "enqueued_at": "1000"}]
    assert (cursor, examined, gone) == ("5|b", 3, 1)
    assert finder.parse_find(["5", "b", 1, 3, 0])[1] is None  # done: no cursor
    assert cron.parse_schedule_define(["exists", 4]) == ("exists", 4)
    with pytest.raises(ValueError, match="expected 'ok' or 'lost'"):
        tr.parse_lease_reply(["not", "a", "lease", "reply"])
