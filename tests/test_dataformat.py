"""The data format in Redis (forq.dataformat): written on first use, raised by a newer
forq, and refused, with a clear message and nothing changed, by a forq too old for it."""

from __future__ import annotations

import pytest

from forq import IncompatibleFormat, Queue, dataformat
from forq.connection import connect
from forq.keys import FORMAT as FORMAT_KEY
from tests.redis_server import RedisServer
from tests.supervisors import SupervisorProcess, write_config


@pytest.fixture
def server():
    with RedisServer() as s:
        yield s


def test_first_use_writes_the_format_and_a_newer_forq_raises_it(server, monkeypatch):
    Queue("q", redis=connect(server.url)).enqueue("tests.echo", 1)
    r = connect(server.url)
    assert r.hgetall(FORMAT_KEY) == {"version": "1", "readers_from": "1"}
    # a newer forq whose data format-1 readers would misread
    monkeypatch.setattr(dataformat, "FORMAT", 2)
    monkeypatch.setattr(dataformat, "READERS_FROM", 2)
    Queue("q", redis=connect(server.url)).enqueue("tests.echo", 2)
    assert r.hgetall(FORMAT_KEY) == {"version": "2", "readers_from": "2"}
    monkeypatch.undo()
    # from now on this (older) forq refuses, and writes nothing
    keys = r.dbsize()
    with pytest.raises(IncompatibleFormat) as refused:
        Queue("q", redis=connect(server.url)).enqueue("tests.echo", 3)
    assert str(refused.value) == (
        "Redis holds forq data in format 2, which needs a forq that speaks format 2 or "
        "newer; this forq speaks format 1: upgrade forq here (nothing was changed)")
    assert r.dbsize() == keys and r.zcard("forq:{q}:pending") == 2


def test_a_newer_format_that_old_readers_understand_is_used_and_kept(server):
    r = connect(server.url)
    r.hset(FORMAT_KEY, mapping={"version": 3, "readers_from": 1})
    assert Queue("q", redis=r).enqueue("tests.echo", 1).id
    assert r.hgetall(FORMAT_KEY) == {"version": "3", "readers_from": "1"}  # not lowered


@pytest.mark.timeout(60)
def test_a_supervisor_refuses_a_format_it_cannot_read(tmp_path, server):
    connect(server.url).hset(FORMAT_KEY, mapping={"version": 2, "readers_from": 2})
    sup = SupervisorProcess(write_config(tmp_path / "forq.toml", server.url, {"q": 1}))
    sup.start(wait_ready=False)
    assert sup.wait(timeout=30) == 2
    lines = [ln for ln in sup.log().splitlines() if "format" in ln]
    assert len(lines) == 1 and "refusing to start" in lines[0], sup.log()
    assert "speaks format 1" in lines[0] and "Traceback" not in sup.log()
