"""`forq web` over HTTP, against a real Redis and a real `forq web` process: paging,
CSRF, read-only, auth, and what the supervisors publish for it. The browser tests are
in test_web_browser.py."""

from __future__ import annotations

import base64
import http.cookiejar
import json
import re
import subprocess
import sys
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from forq import Queue
from forq.fleet import CHILD_FIELDS, live_supervisors
from forq.store.keys import SCHEDULE_DEFS
from forq.supervisor.leases.calls import leasing
from forq.supervisor.redis_io.roster import Roster
from forq.web import data
from tests.helpers import wait_for, wait_job
from tests.supervisors import SupervisorProcess, write_config
from tests.web_server import REPO, WebProcess

pytest.importorskip("starlette")


class Browserless:
    """urllib with a cookie jar: what a browser sends, minus the browser."""

    def __init__(self, base: str, headers: dict[str, str] | None = None) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        self.headers = headers or {}

    def get(self, path: str) -> tuple[int, str, str]:
        return self._open(urllib.request.Request(self.base + path, headers=self.headers))

    def post(self, path: str, fields: list[tuple[str, str]],
             headers: dict[str, str] | None = None) -> tuple[int, str, str]:
        body = urllib.parse.urlencode(fields).encode()
        request = urllib.request.Request(self.base + path, data=body, method="POST",
                                         headers={**self.headers, **(headers or {})})
        return self._open(request)

    def _open(self, request: urllib.request.Request) -> tuple[int, str, str]:
        try:
            with self.opener.open(request, timeout=10) as response:
                return response.status, response.read().decode(), response.url
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), request.full_url

    def csrf(self, html: str) -> str:
        match = re.search(r'name="csrf" value="([^"]+)"', html)
        assert match, "no CSRF token in the page"
        return match.group(1)


@pytest.fixture(scope="module")
def web(redis_url):
    with WebProcess(redis_url) as process:
        yield process


def _dead_job(queue: Queue, task: str = "tests.fatal", job_id: str | None = None,
              trail: str = "") -> str:
    """A job made dead through the real transitions (claim, then a fatal fail), its
    death report's memory `trail` kept as a supervisor keeps it."""
    options = {"job_id": job_id} if job_id else {}
    job = queue.enqueue(task, priority=1000, **options)  # claimed before anything pending
    lease = leasing(queue).claim("web-test:1", 1, 60_000).leases[0]
    assert lease.id == job.id
    if trail:
        assert leasing(queue).set_output(job.id, lease.token, "", trail=trail) == "ok"
    assert leasing(queue).fail(job.id, lease.token, {"reason": f"{task} refused"}, mode="fatal").outcome == "dead"
    return job.id


def test_lists_are_pages_in_each_lists_order(web, queue):
    low = queue.enqueue_many([{"task": "tests.echo", "args": [i]} for i in range(120)])
    high = queue.enqueue("tests.echo", priority=5)
    # ids in death order: deaths within one millisecond are ordered by id
    dead = [_dead_job(queue, job_id=f"dead-{i}") for i in range(3)]
    client = Browserless(web.url)

    status, html, _ = client.get(f"/queues/{queue.name}/pending")
    assert status == 200
    ids = re.findall(r'<tr data-job="([^"]+)"', html)
    assert ids == [high.id] + [j.id for j in low[:49]]  # claim order: priority, then FIFO
    assert "121 pending, showing 1–50" in html
    _, html, _ = client.get(f"/queues/{queue.name}/pending?offset=100")
    assert re.findall(r'<tr data-job="([^"]+)"', html) == [j.id for j in low[99:]]
    assert 'rel="next"' not in html and 'rel="prev"' in html

    _, html, _ = client.get(f"/queues/{queue.name}/dead")
    assert re.findall(r'<tr data-job="([^"]+)"', html) == dead[::-1]  # newest first
    assert "tests.fatal refused" in html
    _, html, _ = client.get(f"/queues/{queue.name}/finished")  # dead jobs finished too
    assert re.findall(r'<tr data-job="([^"]+)"', html) == dead[::-1]

    _, html, url = client.get(f"/search?q={dead[0]}")  # one hit: straight to the job
    assert url.endswith(f"/jobs/{queue.name}/{dead[0]}") and "tests.fatal refused" in html


def test_overview_counts_and_job_page(web, queue):
    queue.enqueue("tests.echo", key="report-2026-11")
    dead_id = _dead_job(queue, trail="[[1.5,1048576],[0.02,73400320]]")
    queue.set_limits(rate=(50, 1), max_in_flight=3)
    overview = next(q for q in data.overview(queue.redis)["queues"] if q["name"] == queue.name)
    assert (overview["pending"], overview["dead"], overview["max_in_flight"]) == (1, 1, 3)
    assert overview["rate_per_second"] == pytest.approx(50)
    assert overview["failed_per_min"] == 1 and len(overview["chart"]) == data.CHART_MINUTES

    client = Browserless(web.url)
    _, html, _ = client.get("/")
    row = re.search(rf'<tr data-queue="{queue.name}">(.*?)</tr>', html, re.S).group(1)
    assert "rate 50/s" in row and "max in flight 3" in row
    _, html, _ = client.get(f"/jobs/{queue.name}/{dead_id}")
    assert "tests.fatal refused" in html and "claimed" in html and "dead" in html
    trail = re.search(r'<table class="trail">(.*?)</table>', html, re.S).group(1)
    assert re.findall(r"<td>([^<]*)</td>", trail) == ["1.5", "1.0MiB", "0.02", "70.0MiB"]
    _, html, url = client.get("/search?q=report-2026-11")  # by idempotency key
    assert f"/jobs/{queue.name}/" in url and "report-2026-11" in html


def test_overview_shows_the_code_each_supervisor_serves_and_the_job_page_the_code_run(
        web, queue):
    """What a reload leaves in the heartbeat: the code served, the jobs an old fork
    server still finishes, a refused reload (escaped: a record is anyone's writing)."""
    sid = "code-writer-" + queue.name
    roster = Roster(queue.redis, sid)
    roster.beat({"name": sid, "code": "v7+0123456789ab",
                 "code_retiring": [{"code": "v6+ba9876543210", "pid": 77, "jobs": 2}],
                 "reload_error": {"at": 1_700_000_000.0, "module": "app.tasks",
                                  "error": "cannot import handler module app.tasks: "
                                           "SyntaxError: <script>x</script>"}})
    job = queue.enqueue("tests.echo")
    leasing(queue).claim("web-test:1", 1, 60_000, code="v7+0123456789ab")
    try:
        client = Browserless(web.url)
        # the live part of the page is rendered at most every refresh/2 for every viewer
        def listed() -> str | None:
            page = client.get("/")[1]
            return page if f'data-supervisor="{sid}"' in page else None

        html = wait_for(listed, timeout=10, message="the supervisor listed")
        row = html.split(f'<tr data-supervisor="{sid}">', 1)[1].split("</tr>", 1)[0]
        assert "v7+0123456789ab" in row and "+2 job(s) finishing in v6+ba9876543210" in row
        assert "reload refused" in row and "&lt;script&gt;" in row and "<script>" not in row
        _, html, _ = client.get(f"/jobs/{queue.name}/{job.id}")
        assert "<dt>code</dt>" in html and "v7+0123456789ab" in html
    finally:
        roster.leave()


def test_batch_page_waiting_list_and_dependency_links(web, queue):
    batch = queue.batch([{"task": "tests.echo", "args": [i]} for i in range(data.PAGE_SIZE + 3)],
                        on_complete={"task": "tests.echo"})
    first = batch.member_ids[0]
    child = queue.enqueue("tests.echo", depends_on=[first])
    assert queue.get(child.id).state == "waiting"
    client = Browserless(web.url)

    status, html, _ = client.get(f"/batches/{queue.name}/{batch.id}")
    assert status == 200 and f"{data.PAGE_SIZE + 3} members" in html
    assert html.count("<tr data-job=") == data.PAGE_SIZE  # one page, never the whole batch
    assert f'/jobs/{queue.name}/{batch.id}-on_complete' in html  # the callback's fixed id
    _, more, _ = client.get(f"/batches/{queue.name}/{batch.id}?offset={data.PAGE_SIZE}")
    assert more.count("<tr data-job=") == 3 and batch.member_ids[-1] in more

    _, html, _ = client.get(f"/jobs/{queue.name}/{first}")
    assert f'href="/batches/{queue.name}/{batch.id}"' in html  # the member links its batch
    _, html, _ = client.get(f"/jobs/{queue.name}/{child.id}")
    assert f'href="/jobs/{queue.name}/{first}"' in html  # the waiting job links its parent
    _, html, _ = client.get(f"/queues/{queue.name}/waiting")
    assert f'data-job="{child.id}"' in html and "1 waiting" in html

    def waiting_cell() -> Any:  # the overview is refreshed every second
        row = re.search(rf'<tr data-queue="{queue.name}">(.*?)</tr>', client.get("/")[1], re.S)
        return row and re.search(r'class="n waiting"><a [^>]*>1<', row.group(1))

    wait_for(waiting_cell, timeout=5, message="1 waiting in the queue's overview row")
    status, html, _ = client.get(f"/batches/{queue.name}/no-such-batch")
    assert status == 404 and "no batch no-such-batch" in html


def test_post_without_csrf_token_is_refused(web, queue):
    client = Browserless(web.url)
    status, html, _ = client.get(f"/queues/{queue.name}/pending")
    token = client.csrf(html)

    status, body, _ = client.post(f"/queues/{queue.name}/limits", [("max_in_flight", "7")])
    assert status == 403 and "CSRF" in body
    status, _, _ = client.post(f"/queues/{queue.name}/limits",
                               [("max_in_flight", "7"), ("csrf", "x" * 32)])
    assert status == 403
    stranger = Browserless(web.url)  # a token from another browser: its cookie differs
    stranger.get("/")
    status, _, _ = stranger.post(f"/queues/{queue.name}/limits",
                                 [("max_in_flight", "7"), ("csrf", token)])
    assert status == 403
    status, _, _ = client.post(f"/queues/{queue.name}/limits",
                               [("max_in_flight", "7"), ("csrf", token)],
                               headers={"Origin": "http://evil.example"})
    assert status == 403
    assert queue.limits() == {}

    status, html, url = client.post(f"/queues/{queue.name}/limits",
                                    [("max_in_flight", "7"), ("rate", "10/s"), ("csrf", token),
                                     ("next", f"/queues/{queue.name}/pending")])
    assert status == 200 and "done=" in url and "max_in_flight 7" in html
    assert queue.limits()["max_in_flight"] == 7
    status, html, _ = client.post(f"/queues/{queue.name}/limits",
                                  [("rate", "fast"), ("csrf", token)])
    assert status == 400 and "rate" in html  # a bad value says what was wrong


def test_pause_and_resume_buttons(web, queue):
    queue.enqueue("tests.echo")  # a known queue: listed on the overview
    client = Browserless(web.url)
    _, html, _ = client.get(f"/queues/{queue.name}/pending")
    assert f'action="/queues/{queue.name}/pause"' in html and "badge paused" not in html
    token = client.csrf(html)
    status, _, _ = client.post(f"/queues/{queue.name}/pause", [])  # no CSRF token
    assert status == 403 and not queue.is_paused()

    status, html, _ = client.post(f"/queues/{queue.name}/pause",
                                  [("csrf", token), ("next", f"/queues/{queue.name}/pending")])
    assert status == 200 and f"paused {queue.name}" in html and queue.is_paused()
    assert f'action="/queues/{queue.name}/resume"' in html and "badge paused" in html
    overview = next(q for q in data.overview(queue.redis)["queues"] if q["name"] == queue.name)
    assert overview["paused"] is True


    def overview_row() -> str:  # the live part is re-rendered at most every half second
        found = re.search(rf'<tr data-queue="{queue.name}">(.*?)</tr>', client.get("/")[1], re.S)
        return found.group(1) if found and "badge paused" in found.group(1) else ""

    wait_for(overview_row, timeout=10, message="the overview's paused badge")

    status, html, _ = client.post(f"/queues/{queue.name}/resume",
                                  [("csrf", token), ("next", f"/queues/{queue.name}/pending")])
    assert status == 200 and f"resumed {queue.name}" in html and not queue.is_paused()
    status, html, _ = client.post(f"/queues/{queue.name}/resume", [("csrf", token)])
    assert status == 200 and "was not paused" in html


def test_a_throttled_queue_is_shown_and_its_throttle_lifted(web, queue):
    """A handler's current().throttle (here set as an operator would, Queue.throttle):
    a badge on the overview and on the queue, a button (with CSRF) that lifts it; a job
    put off by its handler shows its snoozes."""
    queue.enqueue("tests.echo")
    queue.throttle("10m")
    client = Browserless(web.url)
    _, html, _ = client.get(f"/queues/{queue.name}/pending")
    assert "badge paused\">throttled " in html and f'action="/queues/{queue.name}/unthrottle"' in html
    overview = next(q for q in data.overview(queue.redis)["queues"] if q["name"] == queue.name)
    assert 590 < overview["throttled_for"] <= 600
    token = client.csrf(html)
    status, _, _ = client.post(f"/queues/{queue.name}/unthrottle", [])  # no CSRF token
    assert status == 403 and queue.throttled() is not None
    status, html, _ = client.post(f"/queues/{queue.name}/unthrottle",
                                  [("csrf", token), ("next", f"/queues/{queue.name}/pending")])
    assert status == 200 and f"lifted the throttle of {queue.name}" in html
    assert queue.throttled() is None and "unthrottle" not in html
    job = queue.enqueue("tests.echo", max_snoozes=7)
    queue.redis.hset(queue.keys.job(job.id), "snoozes", 2)
    _, html, _ = client.get(f"/jobs/{queue.name}/{job.id}")
    assert "<dt>snoozes</dt><dd>2 of 7" in html


def test_dead_actions_selected_and_by_task(web, queue):
    a, b = _dead_job(queue), _dead_job(queue)
    other = _dead_job(queue, "tests.fail")
    client = Browserless(web.url)
    token = client.csrf(client.get(f"/queues/{queue.name}/dead")[1])
    status, html, _ = client.post(f"/queues/{queue.name}/dead/requeue",
                                  [("scope", "selected"), ("id", a), ("csrf", token),
                                   ("next", f"/queues/{queue.name}/dead")])
    assert status == 200 and "requeued 1 dead job" in html
    assert queue.get(a).state == "pending" and queue.get(b).state == "dead"
    status, html, _ = client.post(f"/queues/{queue.name}/dead/purge",
                                  [("scope", "task"), ("task", "tests.fail"), ("csrf", token)])
    assert status == 200 and "purged 1 dead job" in html
    assert queue.redis.zrange(queue.keys.dead, 0, -1) == [b] and other not in html


def test_read_only_has_no_actions_and_refuses_posts(redis_url, queue):
    dead_id = _dead_job(queue)
    queue.pause()  # a paused queue offers resume, but not when read-only
    with WebProcess(redis_url, "--read-only") as web:
        client = Browserless(web.url)
        for path in (f"/queues/{queue.name}/dead", f"/jobs/{queue.name}/{dead_id}",
                     f"/queues/{queue.name}/pending"):
            status, html, _ = client.get(path)
            # the one button left is the list's filter: a GET, which reads
            html = html.replace('<button type="submit">filter</button>', "")
            assert status == 200 and 'method="post"' not in html and "<button" not in html
        token = client.csrf(client.get("/")[1]) if 'name="csrf"' in client.get("/")[1] else "t" * 32
        status, body, _ = client.post(f"/queues/{queue.name}/dead/requeue",
                                      [("scope", "all"), ("csrf", token)])
        assert status == 403 and "read-only" in body
        status, _, _ = client.post(f"/queues/{queue.name}/resume", [("csrf", token)])
        assert status == 403
    assert queue.get(dead_id).state == "dead" and queue.is_paused()


def test_auth_token_and_basic(redis_url, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    with WebProcess(redis_url, "--token-file", str(token_file),
                    env={"FORQ_WEB_BASIC_AUTH": "ops:pa55"}) as web:
        assert Browserless(web.url).get("/")[0] == 401
        assert Browserless(web.url, {"Authorization": "Bearer wrong"}).get("/")[0] == 401
        assert Browserless(web.url, {"Authorization": "Bearer s3cret-token"}).get("/")[0] == 200
        basic = base64.b64encode(b"ops:pa55").decode()
        assert Browserless(web.url, {"Authorization": f"Basic {basic}"}).get("/")[0] == 200
        browser = Browserless(web.url)  # signs in once, then the cookie carries it
        status, _, url = browser.get("/running?token=s3cret-token")
        assert status == 200 and url.endswith("/running") and "token" not in url
        assert browser.get("/schedules")[0] == 200


def test_web_without_the_extra_says_what_to_install(redis_url, tmp_path):
    shadow = tmp_path / "jinja2"
    shadow.mkdir()
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'jinja2'\", name='jinja2')\n")
    run = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "web", "--redis",
                          redis_url], capture_output=True, text=True, timeout=30, cwd=REPO,
                         env={"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "pip install 'forq[web]'" in run.stderr
    bad = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "web", "--listen",
                          "localhost"], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert bad.returncode == 2 and "--listen" in bad.stderr and "Traceback" not in bad.stderr


def test_supervisor_publishes_children_and_schedules(redis_url, r, queue, tmp_path):
    """One heartbeat record lists the running child; schedules are in Redis, so
    `forq schedules` needs no config; the finished index and the counts follow."""
    gate = tmp_path / "gate"
    schedule = f"{queue.name}-tick"
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2}, extra=textwrap.dedent(f"""
        [[schedule]]
        name = "{schedule}"
        cron = "@every 1h"
        queue = "{queue.name}"
        task = "tests.echo"
    """))
    try:
        with SupervisorProcess(config) as sup:
            job = queue.enqueue("tests.wait_file", str(gate), timeout="20s")

            def listed():
                for record in live_supervisors(r):
                    for row in record.get("children") or []:
                        if row[0] == job.id:
                            return record, dict(zip(CHILD_FIELDS, row, strict=True))
                return None

            record, child = wait_for(listed, timeout=10, message="the child in a heartbeat")
            assert record["pid"] == sup.pid and record["memory_mode"] == "rss"
            assert child["queue"] == queue.name and child["task"] == "tests.wait_file"
            assert child["pid"] > 0 and child["timeout"] == 20 and child["memory_limit"] == 256 << 20
            assert 0 < child["lease_left"] <= 2
            running = data.running(r)
            read_for_ms = data.redis_now_ms(r) - running["now_ms"]
            mine = next(j for j in running["jobs"] if j["id"] == job.id)
            assert mine["child"]["pid"] == child["pid"]
            # now_ms is read first: an extension while the page is read may add that much
            assert 0 < mine["lease_deadline_ms"] - running["now_ms"] <= 2000 + read_for_ms

            rows = wait_for(lambda: [row for row in data.schedules(r)["rows"]
                                     if row["name"] == schedule], message="schedule published")
            assert rows[0]["next_fire"] % 3600 == 0 and not rows[0]["stale"]
            listing = subprocess.run(
                [sys.executable, "-m", "forq.supervisor.cli", "schedules", "--json",
                 "--redis", redis_url], capture_output=True, text=True, timeout=30, cwd=REPO)
            assert listing.returncode == 0, listing.stderr
            assert schedule in [row["name"] for row in json.loads(listing.stdout)]

            gate.touch()
            wait_job(queue, job.id, ("succeeded",))
            assert r.zrevrange(queue.keys.finished, 0, 0) == [job.id]
    finally:
        r.hdel(SCHEDULE_DEFS, schedule)


def test_finished_index_is_capped(queue):
    """10,005 jobs finish (cancelled): the index keeps the newest 10,000."""
    first = queue.enqueue_many([{"task": "tests.echo"} for _ in range(10_000)])
    last = queue.enqueue_many([{"task": "tests.echo"} for _ in range(5)])

    def cancel(jobs):
        pipe = queue.redis.pipeline(transaction=False)
        for job in jobs:
            queue.scripts.cancel(keys=[queue.keys.pending, queue.keys.scheduled],
                                 args=[queue.keys.prefix, job.id], client=pipe)
        assert set(pipe.execute()) == {"cancelled"}
        return data.redis_now_ms(queue.redis)

    done_at = cancel(first)
    wait_for(lambda: data.redis_now_ms(queue.redis) > done_at, message="the next millisecond")
    cancel(last)  # strictly newer than all of `first`
    index = queue.redis.zrange(queue.keys.finished, 0, -1)
    assert len(index) == 10_000
    assert set(index) >= {job.id for job in last}
    assert len(set(index) & {job.id for job in first}) == 9_995


def test_hostile_job_content_is_escaped(web, queue):
    """Ids, arguments and reasons are anyone's text: shown, never run as markup."""
    evil = '<img src=x onerror="alert(1)">/x?y#z'
    job_id = _dead_job(queue, job_id=evil)
    queue.redis.hset(queue.keys.job(job_id), "output", "<script>alert(2)</script>")
    client = Browserless(web.url)
    _, listing, _ = client.get(f"/queues/{queue.name}/dead")
    status, page, _ = client.get(f"/jobs/{queue.name}/{urllib.parse.quote(evil)}")
    assert status == 200 and "&lt;script&gt;alert(2)&lt;/script&gt;" in page
    for html in (listing, page):
        assert "<img src=x" not in html and "<script>alert" not in html
        assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;/x?y#z" in html


def test_job_page_and_running_view_show_progress_and_steps(web, queue):
    """Recorded through the real scripts, as a supervisor records them for a handler."""
    job = queue.enqueue("tests.echo", job_id="with-steps")
    lease = leasing(queue).claim("web-test:1", 1, 60_000).leases[0]
    assert leasing(queue).record_step(job.id, lease.token, "charge-card", '{"charge":"ch_<1>"}') == "ok"
    assert leasing(queue).record_step(job.id, lease.token, "ship", '"sent"') == "ok"
    assert leasing(queue).record_progress([(job.id, lease.token, 0.42, "packed <42>")]) == ["ok"]
    running = next(j for j in data.running(queue.redis)["jobs"] if j["id"] == job.id)
    assert (running["progress"], running["progress_message"]) == (0.42, "packed <42>")
    _, html, _ = Browserless(web.url).get(f"/jobs/{queue.name}/{job.id}")
    assert "0.42" in html and "packed &lt;42&gt;" in html
    steps = html.split("durable steps", 1)[1]
    assert steps.index("charge-card") < steps.index("ship"), steps
    assert "ch_\\u003c1\\u003e" in steps or "ch_&lt;1&gt;" in steps, steps


@pytest.mark.timeout(60)
def test_running_now_shows_a_prefetched_job_as_held(web, redis_url, queue, tmp_path):
    gate = tmp_path / "gate"
    cfg = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1},
                       queue_extra="prefetch = 1\n")
    with SupervisorProcess(cfg).start() as sup:
        running = queue.enqueue("tests.wait_file", str(gate))
        held = queue.enqueue("tests.echo", "later")

        def listed() -> dict[str, Any] | None:  # by the supervisor's next heartbeat
            jobs = {j["id"]: j for j in data.running(queue.redis)["jobs"]}
            ok = (running.id in jobs and jobs[running.id]["child"].get("pid")
                  and held.id in jobs and jobs[held.id]["held"])
            return jobs if ok else None

        jobs = wait_for(listed, timeout=15, message="the running and the held job listed")
        assert jobs[running.id]["held"] is False and "pid" not in jobs[held.id]["child"]
        _, html, _ = Browserless(web.url).get("/running")
        row = html.split(f'<tr data-job="{held.id}"', 1)[1].split("</tr>", 1)[0]
        assert "held (prefetch)" in row and "starting" not in row, row
        row = html.split(f'<tr data-job="{running.id}"', 1)[1].split("</tr>", 1)[0]
        assert "held (prefetch)" not in row, row
        gate.touch()
        assert wait_job(queue, held.id, ("succeeded",), context=lambda: sup.log()[-3000:])


@pytest.mark.parametrize("junk", ["job-1", {"job-1": 1}, [1, None, ["job-1"], {"id": "job-1"}],
                                  ["x" * 10_000] * 2_000, None],
                         ids=["string", "object", "not-strings", "huge", "null"])
def test_running_now_takes_only_job_ids_from_a_heartbeats_held_list(queue, junk):
    """A heartbeat record is read by every dashboard: a malformed `held` list (an older
    or broken writer) marks nothing held and breaks nothing."""
    job = queue.enqueue("tests.echo", job_id="job-1")
    leasing(queue).claim("junk-writer:1", 1, 60_000)
    roster = Roster(queue.redis, "junk-writer:1")
    roster.beat({"name": "junk-writer", "children": [], "held": junk})
    try:
        jobs = {j["id"]: j for j in data.running(queue.redis)["jobs"]}
    finally:
        roster.leave()
    assert jobs[job.id]["held"] is False and jobs[job.id]["owner_alive"] is True
