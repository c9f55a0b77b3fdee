"""The dashboard's use of the event streams: a queue's events page (over HTTP, a real
`forq web`), and the live views that are not rendered again while nothing happens
(`Dashboard.live_fragment` on the real Redis: the render cache aged by hand, no sleep)."""

from __future__ import annotations

import html as html_lib
import re
from collections.abc import Iterator

import pytest

from forq import Queue
from forq.store.connection import connect
from forq.supervisor.leases.calls import leasing
from forq.testing.redis import RedisServer
from tests.test_web import Browserless
from tests.web_server import WebProcess

pytest.importorskip("starlette")


@pytest.fixture(scope="module")
def web(redis_url):
    with WebProcess(redis_url) as process:
        yield process


def test_the_events_page_lists_filters_pages_and_escapes(web, queue: Queue):
    client = Browserless(web.url)
    hostile = queue.enqueue("evil", job_id="<b>x</b>")
    lease = leasing(queue).claim("web-test:1", 1, 60_000).leases[0]
    leasing(queue).fail(hostile.id, lease.token, {"message": "<script>alert(1)</script>"},
                        mode="fatal")
    jobs = queue.enqueue_many([{"task": "plain"}] * 120)
    status, page, _ = client.get(f"/queues/{queue.name}/events")
    assert status == 200
    assert page.count("<tr data-event=") == 100  # one page
    assert f'data-job="{jobs[-1].id}"' in page  # newest first
    older = re.search(r'href="(/queues/[^"]+/events\?before=[^"]+)">older', page)
    assert older, "no link to older events"
    _, rest, _ = client.get(html_lib.unescape(older.group(1)))
    assert rest.count("<tr data-event=") == 24  # 4 of the hostile job, 20 enqueued
    assert "<script>alert" not in rest and html_lib.escape("<script>alert(1)</script>") in rest
    assert "<b>x</b>" not in rest
    _, dead, _ = client.get(f"/queues/{queue.name}/events?event=dead")
    assert dead.count("<tr data-event=") == 1 and 'data-event="dead"' in dead
    _, one, _ = client.get(f"/queues/{queue.name}/events?job={jobs[0].id}")
    assert one.count("<tr data-event=") == 1
    status, bad, _ = client.get(f"/queues/{queue.name}/events?event=exploded")
    assert status == 400 and "no kind of event" in bad
    status, bad, _ = client.get(f"/queues/{queue.name}/events?before=1;DROP")
    assert status == 400 and "not a stream id" in bad
    queue.set_on_dead("alerts.job_died")  # a setting that is no number: the page still shows
    status, jobs_page, _ = client.get(f"/queues/{queue.name}/pending")
    assert status == 200 and f'href="/queues/{queue.name}/events"' in jobs_page
    queue.set_events(False)
    _, off, _ = client.get(f"/queues/{queue.name}/events")
    assert "events are off for this queue" in off


def test_a_tasks_resumed_event_names_no_job_and_links_none(web, queue: Queue):
    """A circuit breaker's `resumed` is a task's, not a job's: its row has no job link."""
    queue.redis.hset(queue.keys.tripped, "t.bad", '{"pattern": "signal:SIGSEGV"}')
    assert queue.resume(task="t.bad") is True
    status, page, _ = Browserless(web.url).get(f"/queues/{queue.name}/events?event=resumed")
    assert status == 200
    row = page.split('data-event="resumed"', 1)[1].split("</tr>", 1)[0]
    assert "t.bad" in row and "by=operator" in row and "/jobs/" not in row, row


@pytest.fixture
def alone() -> Iterator[Queue]:
    """A queue on a Redis of its own: no other test's queue or supervisor moves the
    markers the live views compare."""
    with RedisServer() as server:
        yield Queue("live", redis=connect(server.url))


def test_a_live_view_is_not_rendered_again_while_nothing_happens(alone: Queue):
    from forq.web.app import Dashboard
    from forq.web.events import IDLE_REFRESH

    queue = alone
    queue.enqueue("t")
    board = Dashboard(queue.redis, refresh=0.2)

    def aged(view: str, seconds: float) -> None:
        at, html, marker = board._live[view]
        board._live[view] = (at - seconds, html, marker)

    first = board.live_fragment("overview")
    aged("overview", 0.5)  # past the refresh period, nothing happened
    assert board.live_fragment("overview") is first
    queue.enqueue("t")  # an event: rendered again
    second = board.live_fragment("overview")
    assert second is not first
    aged("overview", IDLE_REFRESH)  # nothing happened, but for long: rendered again
    assert board.live_fragment("overview") is not second
    third = board.live_fragment("overview")
    queue.pause()  # no event, but the settings hash changed
    aged("overview", 0.5)
    assert board.live_fragment("overview") is not third
    # running now, with a job running: every period, its countdown moves by itself
    queue.resume()
    assert len(leasing(queue).claim("web-test:1", 1, 60_000).leases) == 1
    running = board.live_fragment("running")
    aged("running", 0.5)
    assert board.live_fragment("running") is not running
    # a queue without events: every period, nothing tells it apart from idle
    queue.set_events(False)
    fourth = board.live_fragment("overview")
    aged("overview", 0.5)
    assert board.live_fragment("overview") is not fourth
