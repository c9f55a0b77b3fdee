"""Shared fixtures: a real Redis (never a fake) and queues with unique names."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis as redis_lib

from forq import Queue
from forq.connection import connect
from tests.redis_server import DEFAULT_TEST_URL, RedisServer, reachable


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("FORQ_REDIS_URL", DEFAULT_TEST_URL)
    if reachable(url):
        yield url
        return
    with RedisServer() as server:
        os.environ["FORQ_REDIS_URL"] = server.url
        yield server.url


@pytest.fixture
def r(redis_url: str) -> redis_lib.Redis:
    return connect(redis_url)


@pytest.fixture
def queue_name() -> str:
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def queue(r: redis_lib.Redis, queue_name: str) -> Iterator[Queue]:
    q = Queue(queue_name, redis=r)
    yield q
    keys = list(r.scan_iter(match=f"forq:{{{queue_name}}}:*", count=1000))
    for start in range(0, len(keys), 500):
        r.delete(*keys[start:start + 500])
    r.srem("forq:queues", queue_name)
