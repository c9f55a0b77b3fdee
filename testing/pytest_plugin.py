"""pytest fixtures for applications that use forq: a real Redis, a fresh queue, and a
real supervisor running your handlers — what RQ and Celery users write by hand.

    # conftest.py
    pytest_plugins = ["forq.testing.pytest_plugin"]

    # test_tasks.py
    def test_resize(forq_worker):
        queue = forq_worker(imports=["myapp.tasks"])  # `forq run` on a fresh queue
        job = queue.enqueue("images.resize", "a.png")
        assert job.wait(timeout=10) == {"path": "a.png", "width": 128}

Redis: ``FORQ_REDIS_URL`` if one answers there (point it at a database you can spare),
else a private ``redis-server`` on a free port for the session. Each test gets queues
with unique names, deleted afterwards; the supervisor is stopped (drained) at the end
of the test, and its log is printed if the test failed.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from forq import Queue
from forq.store.connection import connect
from forq.testing.redis import DEFAULT_TEST_URL, RedisServer, delete_queue, reachable
from forq.testing.supervisor import SupervisorProcess, write_config


@pytest.fixture(scope="session")
def forq_redis_url() -> Iterator[str]:
    """FORQ_REDIS_URL if a Redis answers there, else a private one for the session (and
    FORQ_REDIS_URL pointing at it meanwhile, for the code under test)."""
    url = os.environ.get("FORQ_REDIS_URL", DEFAULT_TEST_URL)
    if reachable(url):
        yield url
        return
    before = os.environ.get("FORQ_REDIS_URL")
    with RedisServer() as server:
        os.environ["FORQ_REDIS_URL"] = server.url
        try:
            yield server.url
        finally:
            if before is None:
                os.environ.pop("FORQ_REDIS_URL", None)
            else:
                os.environ["FORQ_REDIS_URL"] = before


@pytest.fixture
def forq_queue(forq_redis_url: str) -> Iterator[Queue]:
    """A queue with a unique name, deleted after the test."""
    client = connect(forq_redis_url)
    queue = Queue("t" + uuid.uuid4().hex[:12], redis=client)
    yield queue
    delete_queue(client, queue.name)
    client.close()


@pytest.fixture
def forq_worker(forq_redis_url: str, forq_queue: Queue, tmp_path: Path,
                request: pytest.FixtureRequest) -> Iterator[Callable[..., Queue]]:
    """A factory: ``forq_worker(imports=[...], concurrency=2, **write_config options)``
    starts a real supervisor serving `forq_queue` and returns that queue."""
    started: list[SupervisorProcess] = []

    def start(imports: list[str], concurrency: int = 2, **options: Any) -> Queue:
        config = write_config(tmp_path / f"forq-{len(started)}.toml", forq_redis_url,
                              {forq_queue.name: concurrency}, imports=imports, **options)
        sup = SupervisorProcess(config, cwd=str(request.config.rootpath))
        started.append(sup)
        sup.start()
        return forq_queue

    yield start
    failed = getattr(request.node, "rep_call", None)
    for sup in started:
        sup.stop()
        if failed is not None and failed.failed:
            print(f"--- forq supervisor log ({sup.log_path}) ---\n{sup.log()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome: Any = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
