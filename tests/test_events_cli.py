"""`forq events` and `forq enqueue --replace/--debounce/--key-scope`: the output, the
settings, and one line (exit 2) for each bad input. In this process (`main(argv)`, its
stdout and stderr captured): a Python start-up per case would cost a second each;
tests/test_events_supervisor.py runs `forq events --follow` as a process.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from forq import Queue
from forq.supervisor.cli.main import main
from forq.supervisor.leases.calls import leasing
from tests.test_cli import ok, ok_json, one_line_error


class Forq:
    """`forq ARGS...` in this process, as a CompletedProcess."""

    def __init__(self, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.redis_url = redis_url
        self.capsys = capsys

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        self.capsys.readouterr()
        code = main(["--redis", self.redis_url, *args])
        out, err = self.capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    def many(self, *argvs: list[str]) -> list[subprocess.CompletedProcess[str]]:
        return [self(*argv) for argv in argvs]


@pytest.fixture
def forq(redis_url: str, capsys: pytest.CaptureFixture[str]) -> Forq:
    return Forq(redis_url, capsys)


def test_forq_events_prints_lines_json_and_filters(forq, queue: Queue):
    job = queue.enqueue("mail.send", 1)
    (lease,) = leasing(queue).claim("host-a:1", 1, 60_000).leases
    leasing(queue).fail(job.id, lease.token, {"message": "bad\nnews\tindeed"}, mode="fatal")
    other = queue.enqueue("mail.other")
    text, as_json, only_dead, last_one, one_job = forq.many(
        ["events", queue.name], ["events", queue.name, "--json", "--all"],
        ["events", queue.name, "--event", "dead"], ["events", queue.name, "--last", "1"],
        ["events", queue.name, "--job", other.id, "--json"])
    lines = ok(text).splitlines()
    assert [line.split()[2] for line in lines] == ["enqueued", "started", "failed", "dead",
                                                  "enqueued"]
    assert lines[3].endswith("reason: bad news indeed")  # one line, whatever it held
    assert "on host-a:1" in lines[1]
    rows = [json.loads(line) for line in ok(as_json).splitlines()]
    assert [r["event"] for r in rows] == ["enqueued", "started", "failed", "dead", "enqueued"]
    assert rows[2]["attempt"] == "1" and rows[0]["state"] == "pending"
    assert [line.split()[2] for line in ok(only_dead).splitlines()] == ["dead"]
    assert ok(last_one).split()[3] == other.id
    assert [json.loads(line)["id"] for line in ok(one_job).splitlines()] == [other.id]


def test_forq_events_settings(forq, queue: Queue):
    assert ok_json(forq("events", queue.name, "--enable", "--keep", "500", "--on-dead",
                        "alerts.died", "--json")) == \
        {"queue": queue.name, "events": True, "keep": 500, "on_dead": "alerts.died"}
    assert ok(forq("events", queue.name, "--disable", "--on-dead", "none")) == \
        f"queue {queue.name}: events off; on_dead none\n"
    assert queue.event_settings() == {"events": False, "keep": 0, "on_dead": None}
    off = forq("events", queue.name)
    assert ok(off) == "" and f"events are off for queue {queue.name}" in off.stderr


def test_forq_events_bad_input_is_one_line(forq, queue: Queue):
    cases = [
        (["events", queue.name, "--event", "exploded"], "not a kind of event"),
        (["events", queue.name, "--last", "-1"], "--last must be 0 or more"),
        (["events", queue.name, "--last", "3", "--all"], "give one"),
        (["events", queue.name, "--timeout", "1s"], "--timeout is for --follow"),
        (["events", queue.name, "--follow", "--timeout", "soon"], "--timeout"),
        (["events", queue.name, "--enable", "--disable"], "give one"),
        (["events", queue.name, "--disable", "--keep", "5"], "--keep is for --enable"),
        (["events", queue.name, "--keep", "0"], "--keep must be an integer from 1"),
        (["events", queue.name, "--on-dead", "x" * 201], "--on-dead must be a task name"),
        (["events", "bad{name}"], "queue name"),
        (["enqueue", "t", "-q", queue.name, "--replace"], "replace needs key="),
        (["enqueue", "t", "-q", queue.name, "--key", "k", "--debounce", "1s", "--delay", "1s"],
         "give debounce or delay"),
        (["enqueue", "t", "-q", queue.name, "--key", "k", "--debounce", "0s"],
         "debounce must be more than 0"),
    ]
    for argv, needle in cases:
        proc = forq(*argv)
        one_line_error(proc, 2, needle)
    assert queue.stats()["pending"] == 0


def test_forq_enqueue_debounce_and_replace(forq, queue: Queue):
    first = ok_json(forq("enqueue", "t", "-q", queue.name, "--key", "k", "--debounce", "1h",
                         "--args", "[1]", "--json"))
    again = forq("enqueue", "t", "-q", queue.name, "--key", "k", "--debounce", "1h",
                 "--args", "[2]", "--json")
    assert ok_json(again)["id"] == first["id"] and ok_json(again)["status"] == "replaced"
    assert queue.get(first["id"]).args == [2]
    queued = ok_json(forq("enqueue", "t", "-q", queue.name, "--key", "q", "--replace",
                          "--key-scope", "queued", "--json"))
    assert queued["status"] == "pending"
