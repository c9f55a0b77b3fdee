"""Shared fixtures: a real Redis (never a fake) and queues with unique names, from
forq.testing's pytest plugin (the one applications use) under the tests' own names."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis as redis_lib

from forq import Queue
from forq.store.connection import connect
from forq.testing.redis import delete_queue
from tests import background, layout

pytest_plugins = ["forq.testing.pytest_plugin"]


def pytest_sessionstart(session: pytest.Session) -> None:
    """A module added since `make` linked forq's editable install is not importable as
    forq.* yet: say so once, with the command that relinks, not as ImportErrors."""
    message = layout.stale_message()
    if message:
        pytest.exit(message, returncode=2)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "background(start, lane): start `start` when the "
                            "session starts, run the test last (tests/background.py)")


@pytest.hookimpl(trylast=True)  # after -k/-m deselection
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    items[:] = background.last(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.config.option.collectonly:
        background.start_marked(session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    background.stop_unfinished()


@pytest.fixture(scope="session")
def redis_url(forq_redis_url: str) -> str:
    return forq_redis_url


@pytest.fixture
def r(redis_url: str) -> Iterator[redis_lib.Redis]:
    client = connect(redis_url)
    yield client
    client.close()  # its pool's sockets: hundreds of tests must not pile up open fds


@pytest.fixture
def queue_name() -> str:
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def queue(r: redis_lib.Redis, queue_name: str) -> Iterator[Queue]:
    yield Queue(queue_name, redis=r)
    delete_queue(r, queue_name)
