"""The data format in Redis (forq.store.dataformat): written on first use, raised by a newer
forq, and refused, with a clear message and nothing changed, by a forq too old for it."""

from __future__ import annotations

import pytest

from forq import IncompatibleFormat, Queue
from forq.store import dataformat
from forq.store.connection import connect
from forq.store.keys import FORMAT as FORMAT_KEY
from tests.redis_server import RedisServer
from tests.supervisors import SupervisorProcess, write_config

MINE = dataformat.FORMAT
NEWER = MINE + 1


@pytest.fixture
def server():
    with RedisServer() as s:
        yield s


def test_first_use_writes_the_format_and_a_newer_forq_raises_it(server, monkeypatch):
    Queue("q", redis=connect(server.url)).enqueue("tests.echo", 1)
    r = connect(server.url)
    assert r.hgetall(FORMAT_KEY) == {"version": str(MINE), "readers_from": str(MINE)}
    # a newer forq whose data this forq's readers would misread
    monkeypatch.setattr(dataformat, "FORMAT", NEWER)
    monkeypatch.setattr(dataformat, "READERS_FROM", NEWER)
    Queue("q", redis=connect(server.url)).enqueue("tests.echo", 2)
    assert r.hgetall(FORMAT_KEY) == {"version": str(NEWER), "readers_from": str(NEWER)}
    monkeypatch.undo()
    # from now on this (older) forq refuses, and writes nothing
    keys = r.dbsize()
    with pytest.raises(IncompatibleFormat) as refused:
        Queue("q", redis=connect(server.url)).enqueue("tests.echo", 3)
    assert str(refused.value) == (
        f"Redis holds forq data in format {NEWER}, which needs a forq that speaks format "
        f"{NEWER} or newer; this forq speaks format {MINE}: upgrade forq here (nothing was "
        "changed)")
    assert r.dbsize() == keys and r.zcard("forq:{q}:pending") == 2


def test_a_newer_format_that_old_readers_understand_is_used_and_kept(server):
    r = connect(server.url)
    r.hset(FORMAT_KEY, mapping={"version": NEWER + 1, "readers_from": MINE})
    assert Queue("q", redis=r).enqueue("tests.echo", 1).id
    assert r.hgetall(FORMAT_KEY) == {"version": str(NEWER + 1), "readers_from": str(MINE)}


@pytest.mark.timeout(60)
def test_a_supervisor_refuses_a_format_it_cannot_read(tmp_path, server):
    connect(server.url).hset(FORMAT_KEY, mapping={"version": NEWER, "readers_from": NEWER})
    sup = SupervisorProcess(write_config(tmp_path / "forq.toml", server.url, {"q": 1}))
    sup.start(wait_ready=False)
    assert sup.wait(timeout=30) == 2
    lines = [ln for ln in sup.log().splitlines() if "format" in ln]
    assert len(lines) == 1 and "refusing to start" in lines[0], sup.log()
    assert f"speaks format {MINE}" in lines[0] and "Traceback" not in sup.log()
