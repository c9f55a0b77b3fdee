"""Find jobs by state, task, error, age, group or argument, and act on all of them.

A queue keeps one sorted set per state (the dead set, pending, scheduled, …), never a
list of every job, and no index per task: an index must stay exact under every
transition, and one per task would cost every job a write for a query operators run
now and then. So a search walks the state's set in score order with `lua/find.lua`,
each call examining at most `EXAMINE` entries (a few ms of Redis time), and goes on from
a cursor: the work per page is bounded whatever the set's size, and nothing runs `KEYS`
or a `SCAN` of the keyspace. The dead set and the finished index are ordered by time, so
`since` on them starts the walk at that time (O(log n)) instead of filtering.

The error pattern is a Python regular expression, matched here, on the client, against
the job's reason (at most `REASON_CHARS` characters of it): Lua has no regular
expressions. Patterns that can backtrack exponentially are refused (`safe_pattern`).

Bulk actions (`act`) walk the same way and act on each page's matches at once, each job
by its own atomic script call: a job that changed meanwhile (started, requeued, its
record trimmed) is skipped and counted, never acted on in a state the action does not
apply to. The walk stops at the set's last entry when it began, so a job requeued by
the action that dies again is not chased.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from forq.errors import PayloadError
from forq.payload import MAX_NAME, group_problem
from forq.store import transitions as tr
from forq.store.keys import QueueKeys
from forq.store.plans import Plan
from forq.units import UnitError, parse_duration

try:  # the parser `re` compiles with: Python 3.11+, then 3.10's name for it
    _sre = importlib.import_module("re._parser")
except ImportError:  # pragma: no cover - Python 3.10
    _sre = importlib.import_module("sre_parse")

EXAMINE = 1000  # set entries one find call looks at
MAX_CALLS = 20  # find calls one page may take to fill (20,000 entries examined at most)
ARGS_BYTES = 4 << 20  # bytes of arguments one call searches for `args_contains`
REASON_CHARS = 1000  # characters of a job's reason the error pattern sees
MAX_PATTERN = 200  # characters of an error pattern
MAX_NEEDLE = 1000  # characters of an args_contains text
MAX_PAGE = 1000  # jobs in one page
ACT_BATCH = 200  # ids per requeue/purge call, script calls per pipeline of a bulk action

# state -> (the set walked: a QueueKeys attribute, what the set's score is for `since`:
# "score" when it is the time the job got there, else the record's time field)
FINDABLE: dict[str, tuple[str, str]] = {
    "pending": ("pending", "enqueued_at"),
    "scheduled": ("scheduled", "enqueued_at"),
    "waiting": ("waiting", "enqueued_at"),
    "active": ("active", "started_at"),
    "dead": ("dead", "score"),
    "succeeded": ("finished", "score"),
    "cancelled": ("finished", "score"),
}
# a bulk action -> the states it applies to
ACTIONS: dict[str, tuple[str, ...]] = {
    "requeue": ("dead",),
    "purge": ("dead",),
    "cancel": ("pending", "scheduled", "waiting", "active"),
    "promote": ("scheduled",),
}
FIELDS = ("task", "group", "enqueued_at", "started_at", "attempts", "crashes", "run_at",
          "finished_at", "priority", "key", "owner", "dead_reason", "lifo", "error", "state")


def safe_pattern(text: str) -> re.Pattern[str]:
    """`text` compiled, or `PayloadError` saying why not: too long, not a regular
    expression, or one that may backtrack exponentially (a repeated group holding a
    repetition or an alternation, such as ``(a+)+`` or ``(a|ab)*``)."""
    if not isinstance(text, str) or not text:
        raise PayloadError("the error pattern must be a non-empty string")
    if len(text) > MAX_PATTERN:
        raise PayloadError(f"the error pattern is {len(text)} characters, over the "
                           f"{MAX_PATTERN}-character cap")
    try:
        compiled = re.compile(text)
        tree = _sre.parse(text)
    except (re.error, RecursionError) as exc:
        raise PayloadError(f"the error pattern {text!r} is not a regular expression: "
                           f"{exc}"[:300]) from None
    if _nested_repeat(tree, inside=False):
        raise PayloadError(f"the error pattern {text!r} repeats a group that itself repeats "
                           "or alternates, which can take exponential time: write it "
                           "without the nesting (e.g. a+ for (a+)+)"[:300])
    return compiled


def _nested_repeat(pattern: Any, inside: bool) -> bool:
    """Whether a repetition (of more than one) holds another, or an alternation."""
    for op, av in pattern:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, body = av
            repeats = high is _sre.MAXREPEAT or high > 1
            if repeats and inside:
                return True
            if _nested_repeat(body, inside or repeats):
                return True
        elif name == "BRANCH":
            if inside:
                return True
            if any(_nested_repeat(branch, inside) for branch in av[1]):
                return True
        elif name == "SUBPATTERN":
            if _nested_repeat(av[-1], inside):
                return True
        elif name in ("ASSERT", "ASSERT_NOT"):
            if _nested_repeat(av[1], inside):
                return True
        elif name == "ATOMIC_GROUP":
            if _nested_repeat(av, inside):
                return True
    return False


def _duration_ms(value: Any, option: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise PayloadError(f"{option} must be a duration such as \"1h\", got {value!r}")
    try:
        seconds = parse_duration(value, where=option)
    except UnitError as exc:
        raise PayloadError(str(exc)) from None
    if seconds < 0:
        raise PayloadError(f"{option} must not be negative, got {value!r}")
    return int(seconds * 1000)


@dataclass(frozen=True)
class JobFilter:
    """Which jobs of a queue: every field but `state` may be left out (None: any).

    state          one of FINDABLE (succeeded and cancelled: the recent ones, which
                   the queue's finished index keeps, 10,000 at most)
    task           the task name, exactly
    error          a regular expression searched in the job's reason (dead reason,
                   else its last error's type and message)
    since, before  the job got to its state at most / more than this long ago (a
                   duration: "1h", seconds): dead, succeeded and cancelled by when it
                   finished, active by when it started, the others by when enqueued
    args_contains  text its args or kwargs JSON holds, e.g. ``ada@example.com``
    group          its group; for pending, the group's own set is walked (pending
                   grouped jobs wait there, not in `pending`)
    """

    state: str = "pending"
    task: str | None = None
    error: str | None = None
    since: Any = None
    before: Any = None
    args_contains: str | None = None
    group: str | None = None
    pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)
    since_ms: int | None = field(default=None, init=False, repr=False, compare=False)
    before_ms: int | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.state not in FINDABLE:
            raise PayloadError(f"state must be one of {', '.join(FINDABLE)}, got "
                               f"{self.state!r}"[:300])
        if self.task is not None and (not isinstance(self.task, str)
                                      or not 0 < len(self.task) <= MAX_NAME):
            raise PayloadError(f"task must be a name of 1 to {MAX_NAME} characters")
        if self.group is not None and group_problem(self.group):
            raise PayloadError(f"group {group_problem(self.group)}")
        if self.args_contains is not None and (not isinstance(self.args_contains, str)
                                               or not 0 < len(self.args_contains) <= MAX_NEEDLE):
            raise PayloadError(f"args_contains must be text of 1 to {MAX_NEEDLE} characters")
        object.__setattr__(self, "pattern",
                           safe_pattern(self.error) if self.error is not None else None)
        object.__setattr__(self, "since_ms", _duration_ms(self.since, "since"))
        object.__setattr__(self, "before_ms", _duration_ms(self.before, "before"))

    def set_key(self, keys: QueueKeys) -> str:
        """The sorted set this filter walks."""
        if self.state == "pending" and self.group is not None:
            return keys.group_pending(self.group)
        return str(getattr(keys, FINDABLE[self.state][0]))

    def reason_matches(self, record: dict[str, str]) -> bool:
        if self.pattern is None:
            return True
        return self.pattern.search(reason_text(record)) is not None


def reason_text(record: dict[str, str]) -> str:
    """What the error pattern is matched against: the last error as "Type: message",
    then the dead reason (when it says more), one per line, at most REASON_CHARS
    characters: ``^ValueError`` matches by the error's type."""
    parts: list[str] = []
    try:
        err = json.loads(record.get("error") or "null")
    except ValueError:
        err = None
    if isinstance(err, dict):
        kind, message = err.get("type"), err.get("message")
        parts.append(f"{kind}: {message}" if kind else str(message or ""))
        if err.get("reason"):
            parts.append(str(err["reason"]))
    dead_reason = record.get("dead_reason") or ""
    if dead_reason and not any(dead_reason in part for part in parts):
        parts.append(dead_reason)
    return "\n".join(p for p in parts if p)[:REASON_CHARS]


@dataclass
class FoundPage:
    """One page of `find`: the matching records (each a job hash's fields, with "id"),
    and the cursor to pass for the next page (None: the walk is over)."""

    records: list[dict[str, str]]
    cursor: str | None
    examined: int = 0  # set entries looked at for this page
    gone: int = 0  # entries whose record was missing (trimmed, expired, purged)
    jobs: list[Any] = field(default_factory=list)  # the records as `Job`s (Queue.find)


@dataclass
class BulkResult:
    """What a bulk action did: `done` jobs acted on, `skipped` matches that had changed
    when their turn came (another state, or their record gone), `matched` both."""

    action: str
    matched: int = 0
    done: int = 0
    skipped: int = 0
    examined: int = 0
    more: bool = False  # stopped at `limit` with more of the set left to look at

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _cursor(text: str | None) -> tuple[str, str]:
    if not text:
        return "", ""
    score, sep, job_id = text.partition("|")
    try:
        float(score)
    except ValueError:
        score = ""
    if not sep or not score or not job_id:
        raise PayloadError(f"not a cursor of this walk: {text!r}"[:300])
    return score, job_id


def find_call(keys: QueueKeys, filt: JobFilter, cursor: str | None, *, stop: str = "+inf",
              examine: int = EXAMINE, want: int = MAX_PAGE) -> tr.ScriptCall:
    score, job_id = _cursor(cursor)
    return tr.ScriptCall("find", (filt.set_key(keys),), (
        keys.prefix, score, job_id, stop, examine, want, filt.state, filt.task or "",
        filt.group or "", filt.args_contains or "",
        FINDABLE[filt.state][1] if filt.since_ms is not None or filt.before_ms is not None else "",
        "" if filt.since_ms is None else filt.since_ms,
        "" if filt.before_ms is None else filt.before_ms, ARGS_BYTES))


def parse_find(reply: Sequence[Any]) -> tuple[list[dict[str, str]], str | None, int, int]:
    """(matching records, cursor or None at the end, examined, gone)."""
    score, job_id, done, examined, gone = reply[:5]
    records = []
    for m in reply[5:]:
        record = {name: str(v) for name, v in zip(FIELDS, m[2:], strict=False) if v is not None}
        record["id"] = str(m[0])
        record["score"] = str(m[1])
        records.append(record)
    cursor = None if int(done) or not job_id else f"{score}|{job_id}"
    return records, cursor, int(examined), int(gone)


def find(keys: QueueKeys, filt: JobFilter, cursor: str | None = None,
         count: int = 100) -> Plan[FoundPage]:
    """Up to `count` matches from `cursor` on, in at most MAX_CALLS calls: a page may be
    short (even empty) with a cursor when the matches are sparse; go on from it."""
    if not isinstance(count, int) or not 1 <= count <= MAX_PAGE:
        raise PayloadError(f"count must be an integer from 1 to {MAX_PAGE}, got {count!r}")
    page = FoundPage([], cursor)
    for _ in range(MAX_CALLS):
        (reply,) = yield [find_call(keys, filt, page.cursor, want=count - len(page.records))]
        records, page.cursor, examined, gone = parse_find(reply)
        page.examined += examined
        page.gone += gone
        page.records += [dict(r, queue=keys.queue) for r in records if filt.reason_matches(r)]
        if page.cursor is None or len(page.records) >= count:
            break
    return page


def act(keys: QueueKeys, filt: JobFilter, action: str, limit: int | None = None) -> Plan[BulkResult]:
    """Do `action` (ACTIONS) to every job `filt` matches, up to `limit` matches."""
    if action not in ACTIONS:
        raise PayloadError(f"action must be one of {', '.join(ACTIONS)}, got {action!r}"[:300])
    if filt.state not in ACTIONS[action]:
        raise PayloadError(f"{action} acts on {' or '.join(ACTIONS[action])} jobs, not "
                           f"{filt.state}")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise PayloadError(f"limit must be an integer >= 1, got {limit!r}")
    (last,) = yield [("ZRANGE", filt.set_key(keys), -1, -1, "WITHSCORES")]
    result = BulkResult(action)
    if not last:
        return result
    stop = repr(float(last[0][1])) if isinstance(last[0], (list, tuple)) else str(last[1])
    cursor: str | None = None
    while True:
        want = ACT_BATCH if limit is None else min(ACT_BATCH, limit - result.matched)
        (reply,) = yield [find_call(keys, filt, cursor, stop=stop, want=want)]
        records, cursor, examined, _gone = parse_find(reply)
        result.examined += examined
        ids = [r["id"] for r in records if filt.reason_matches(r)]
        result.matched += len(ids)
        if ids:
            done = yield _action_calls(keys, filt, action, ids)
            result.done += _count_done(action, done)
        if cursor is None:
            break
        if limit is not None and result.matched >= limit:
            result.more = True
            break
    result.skipped = result.matched - result.done
    return result


def _action_calls(keys: QueueKeys, filt: JobFilter, action: str,
                  ids: list[str]) -> list[Any]:
    if action == "requeue":
        return [tr.requeue_dead_call(keys, ids, 0)]
    if action == "purge":
        return [tr.purge_dead_call(keys, ids, 0)]
    if action == "cancel":
        return [tr.cancel_call(keys, job_id, only_if=filt.state) for job_id in ids]
    return [tr.promote_call(keys, job_id) for job_id in ids]


def _count_done(action: str, replies: list[Any]) -> int:
    if action in ("requeue", "purge"):
        return tr.parse_dead_batch(replies[0]).done
    if action == "cancel":
        return sum(tr.parse_cancel(r) in ("cancelled", "cancelling") for r in replies)
    return sum(tr.parse_changed_job(r).outcome == "promoted" for r in replies)
