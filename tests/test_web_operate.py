"""The dashboard's operator tools of issue 29 over HTTP, against a real `forq web` and
Redis: one job changed (run now, priority, reschedule), a list's filters and its
bulk actions, ticked jobs acted on, and schedules added, paused, triggered and removed
at run time. Every action is a CSRF-checked POST; a refusal is an error page saying why.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from forq import Queue
from forq.schedules import Schedules
from forq.store.keys import SCHEDULE_DEFS, SCHEDULES, SCHEDULES_RUNTIME
from forq.supervisor.leases.calls import leasing
from tests.test_web import Browserless
from tests.web_server import WebProcess

pytest.importorskip("starlette")


@pytest.fixture(scope="module")
def web(redis_url):
    with WebProcess(redis_url) as process:
        yield process


def dead(queue: Queue, message: str, task: str = "tests.fail") -> str:
    job = queue.enqueue(task, priority=1000)
    lease = leasing(queue).claim("web-operate:1", 1, 60_000).leases[0]
    assert lease.id == job.id
    leasing(queue).fail(job.id, lease.token, {"type": "RuntimeError", "message": message},
                        mode="fatal")
    return job.id


def listed(html: str) -> list[str]:
    return re.findall(r'<tr data-job="([^"]+)"', html)


def test_job_page_runs_now_sets_priority_and_reschedules(web, queue):
    job = queue.enqueue("tests.echo", delay="1h")
    client = Browserless(web.url)
    page = f"/jobs/{queue.name}/{job.id}"
    _, html, _ = client.get(page)
    for action in ("promote", "priority", "reschedule", "cancel"):
        assert f'action="/jobs/{queue.name}/{job.id}/{action}"' in html
    token = client.csrf(html)

    status, body, _ = client.post(f"{page}/priority", [("priority", "7")])  # no CSRF token
    assert status == 403 and "fields" not in body and queue.get(job.id).fields["priority"] == 0
    status, html, _ = client.post(f"{page}/priority", [("priority", "7"), ("csrf", token),
                                                       ("next", page)])
    assert status == 200 and "priority 7 (scheduled)" in html
    status, html, _ = client.post(f"{page}/reschedule", [("in", "2h"), ("csrf", token)])
    assert status == 200 and "rescheduled" in html
    status, html, _ = client.post(f"{page}/reschedule", [("at", "2031-05-06T07:08:09"),
                                                         ("csrf", token)])
    assert status == 200 and queue.redis.zscore(queue.keys.scheduled, job.id) == 1935817689000  # 2031-05-06T07:08:09 UTC
    status, html, _ = client.post(f"{page}/promote", [("csrf", token), ("next", page)])
    assert status == 200 and "promoted job" in html and queue.get(job.id).state == "pending"
    assert f'action="/jobs/{queue.name}/{job.id}/promote"' not in html  # not scheduled now

    status, html, _ = client.post(f"{page}/promote", [("csrf", token)])
    assert status == 409 and "only a scheduled job can be promoted" in html
    for fields, needle in (([("priority", "high")], "expected an integer"),
                           ([("priority", "5000")], "priority must be an integer in"),
                           ([("in", "soon")], "delay"), ([], "one of them"),
                           ([("at", "tomorrow")], "ISO 8601")):
        verb = "priority" if fields and fields[0][0] == "priority" else "reschedule"
        status, html, _ = client.post(f"{page}/{verb}", [*fields, ("csrf", token)])
        assert status == 400 and needle in html, (fields, html[-500:])
    status, html, _ = client.post(f"/jobs/{queue.name}/nope/promote", [("csrf", token)])
    assert status == 404


def test_filters_page_by_cursor_and_refuse_a_bad_pattern(web, queue, r):
    timeouts = [dead(queue, f"timeout {i}") for i in range(55)]
    other = dead(queue, "refused")
    client = Browserless(web.url)
    _, html, _ = client.get(f"/queues/{queue.name}/dead?error=timeout")
    first = listed(html)
    assert len(first) == 50 and other not in first and "matching dead on this page" in html
    more = re.search(r'href="\?([^"]*cursor=[^"]+)" rel="next"', html).group(1)
    _, html, _ = client.get(f"/queues/{queue.name}/dead?{more.replace('&amp;', '&')}")
    assert sorted(first + listed(html)) == sorted(timeouts)
    _, html, _ = client.get(f"/queues/{queue.name}/dead?task=tests.fail&error=^RuntimeError:+ref")
    assert listed(html) == [other]
    status, html, _ = client.get(f"/queues/{queue.name}/dead?error={quote('(a+)+$')}")
    assert status == 400 and "exponential" in html
    status, html, _ = client.get(f"/queues/{queue.name}/dead?since=yesterday")
    assert status == 400 and "since" in html


def test_bulk_actions_on_every_match_and_on_ticked_jobs(web, queue):
    timeouts = [dead(queue, "timeout") for _ in range(3)]
    kept = dead(queue, "refused")
    client = Browserless(web.url)
    listing = f"/queues/{queue.name}/dead?error=timeout"
    _, html, _ = client.get(listing)
    assert f'action="/queues/{queue.name}/bulk/requeue"' in html
    token = client.csrf(html)
    status, html, _ = client.post(f"/queues/{queue.name}/bulk/requeue",
                                  [("state", "dead"), ("error", "timeout"), ("csrf", token),
                                   ("next", f"/queues/{queue.name}/dead")])
    assert status == 200 and "requeued 3 of 3 jobs matching" in html
    assert all(queue.get(j).state == "pending" for j in timeouts)
    assert queue.get(kept).state == "dead"
    status, html, _ = client.post(f"/queues/{queue.name}/bulk/requeue",
                                  [("state", "pending"), ("csrf", token)])
    assert status == 400 and "requeue acts on dead jobs" in html
    status, html, _ = client.post(f"/queues/{queue.name}/bulk/explode",
                                  [("state", "dead"), ("csrf", token)])
    assert status == 404

    later = [queue.enqueue("tests.echo", delay="1h").id for _ in range(2)]
    _, html, _ = client.get(f"/queues/{queue.name}/scheduled")
    assert f'formaction="/queues/{queue.name}/selected/promote"' in html
    status, html, _ = client.post(f"/queues/{queue.name}/selected/promote",
                                  [("id", later[0]), ("id", "gone-away"), ("csrf", token)])
    assert status == 200 and "promoted 1 of 2 jobs selected" in html
    assert queue.get(later[0]).state == "pending" and queue.get(later[1]).state == "scheduled"
    status, html, _ = client.post(f"/queues/{queue.name}/selected/cancel",
                                  [("id", later[1]), ("csrf", token)])
    assert status == 200 and queue.get(later[1]).state == "cancelled"
    status, _, _ = client.post(f"/queues/{queue.name}/selected/cancel", [("id", later[0])])
    assert status == 403 and queue.get(later[0]).state == "pending"  # no CSRF token


@pytest.fixture
def schedule_name(r) -> Iterator[str]:
    name = f"w-{uuid.uuid4().hex[:8]}"
    yield name
    r.hdel(SCHEDULES_RUNTIME, name, f"#paused:{name}", f"#resumed:{name}")
    r.hdel(SCHEDULES, name)
    r.hdel(SCHEDULE_DEFS, name)


def test_schedules_added_paused_triggered_and_removed_from_the_page(web, queue, r,
                                                                    schedule_name):
    client = Browserless(web.url)
    _, html, _ = client.get("/schedules")
    token = client.csrf(html)
    status, html, _ = client.post("/schedules/add", [
        ("name", schedule_name), ("cron", "@hourly"), ("queue", queue.name),
        ("task", "tests.echo"), ("args", '["hi"]'), ("overlap", "skip"), ("csrf", token),
        ("next", "/schedules")])
    assert status == 200 and f"added schedule {schedule_name}" in html
    row = re.search(rf'<tr data-schedule="{schedule_name}">(.*?)</tr>', html, re.S).group(1)
    assert "run-time" in row and "skip" in row and "/pause" in row
    status, html, _ = client.post(f"/schedules/{schedule_name}/pause",
                                  [("csrf", token), ("next", "/schedules")])
    row = re.search(rf'<tr data-schedule="{schedule_name}">(.*?)</tr>', html, re.S).group(1)
    assert "badge paused" in row and "/resume" in row
    status, html, _ = client.post(f"/schedules/{schedule_name}/trigger", [("csrf", token)])
    assert status == 200 and "triggered schedule" in html
    (job_id,) = r.zrange(queue.keys.pending, 0, -1)
    assert queue.get(job_id).args == ["hi"]
    status, html, _ = client.post(f"/schedules/{schedule_name}/trigger", [("csrf", token)])
    assert "not triggered" in html and job_id in html  # overlap = skip: it is pending
    for fields, needle in (([("name", schedule_name)], "queue must be a queue name"),
                           ([("name", "x"), ("cron", "61 * * * *"), ("queue", "q"),
                             ("task", "t")], "valid cron expression"),
                           ([("name", "x"), ("cron", "@daily"), ("queue", "q"), ("task", "t"),
                             ("args", "{")], "must be JSON")):
        status, html, _ = client.post("/schedules/add", [*fields, ("csrf", token)])
        assert status == 400 and needle in html
    status, _, _ = client.post(f"/schedules/{schedule_name}/remove", [])  # no CSRF token
    assert status == 403
    status, html, _ = client.post(f"/schedules/{schedule_name}/remove",
                                  [("csrf", token), ("next", "/schedules")])
    assert status == 200 and f'data-schedule="{schedule_name}"' not in html
    status, html, _ = client.post(f"/schedules/{schedule_name}/pause", [("csrf", token)])
    assert status == 404 and "no run-time schedule" in html
    assert not Schedules(r).list() or all(s["name"] != schedule_name
                                          for s in Schedules(r).list())


def test_a_config_schedule_offers_run_now_only(web, r, queue, schedule_name):
    r.hset(SCHEDULE_DEFS, schedule_name, json.dumps({
        "cron": "@daily", "timezone": "UTC", "queue": queue.name, "task": "tests.echo",
        "args": [], "kwargs": {}, "overlap": "allow", "source": "config", "next": None,
        "seen": int(r.time()[0])}))
    client = Browserless(web.url)
    _, html, _ = client.get("/schedules")
    row = re.search(rf'<tr data-schedule="{schedule_name}">(.*?)</tr>', html, re.S).group(1)
    assert "/trigger" in row and "/pause" not in row and "/remove" not in row
    status, html, _ = client.post(f"/schedules/{schedule_name}/pause",
                                  [("csrf", client.csrf(html))])
    assert status == 400 and "config file, which owns it" in html
