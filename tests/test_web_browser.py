"""`forq web` in a real headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright; never a downloaded browser) against a real `forq web`, Redis and supervisor.

One browser, one dashboard and one supervisor for the module: the checks are what an
operator sees, without reloading the page."""

from __future__ import annotations

import os
import socket
import tempfile
import uuid

import pytest

from forq import Queue
from forq.supervisor.leases.calls import leasing
from tests.helpers import wait_for, wait_job
from tests.supervisors import SupervisorProcess, write_config
from tests.web_server import CHROMIUM, WebProcess, launch_chromium

playwright_api = pytest.importorskip("playwright.sync_api")
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"no {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def served(redis_url, tmp_path_factory):
    """A supervisor serving one queue (2 slots) and a dashboard; yields (queue name, url)."""
    name = "w" + uuid.uuid4().hex[:12]
    tmp = tmp_path_factory.mktemp("web")
    config = write_config(tmp / "forq.toml", redis_url, {name: 2})
    with SupervisorProcess(config) as sup, WebProcess(redis_url) as web:
        web.supervisor_id = f"{socket.gethostname()}:{sup.pid}"
        yield name, web


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context = launch_chromium(p, profile)
        context.set_default_timeout(TIMEOUT_MS)
        yield context
        context.close()


@pytest.fixture
def page(browser):
    page = browser.new_page()
    page.on("dialog", lambda dialog: dialog.accept())  # the confirmations: yes
    yield page
    page.close()


def test_overview_and_running_now_follow_a_job_without_reload(served, page, r, tmp_path):
    name, web = served
    queue = Queue(name, redis=r)
    gate = tmp_path / "gate"
    page.goto(web.url + "/")
    page.evaluate("window.__same_page = true")  # gone if anything reloads the page
    row = page.locator(f'tr[data-queue="{name}"]')

    job = queue.enqueue("tests.wait_file", str(gate), timeout="30s")
    playwright_api.expect(row.locator("td.active")).to_have_text("1")
    # this test's supervisor: others (another test's, stopping) may still be listed
    ours = page.locator(f'tr[data-supervisor="{web.supervisor_id}"] .busy')
    playwright_api.expect(ours).to_have_text("1/2")

    running = page.context.new_page()
    running.goto(web.url + "/running")
    job_row = running.locator(f'tr[data-job="{job.id}"]')
    playwright_api.expect(job_row).to_be_visible()
    playwright_api.expect(job_row.locator("td").nth(2)).to_have_text("tests.wait_file")
    assert int(job_row.locator("td").nth(4).inner_text()) > 0  # the child's pid
    left = float(job_row.locator(".countdown").inner_text().rstrip("s"))
    assert 0 < left <= 2.0  # lease_ttl 2s in the test config

    gate.touch()
    wait_job(queue, job.id, ("succeeded",))
    playwright_api.expect(row.locator("td.active")).to_have_text("0")
    playwright_api.expect(row.locator("td.ok")).to_have_text("1")
    playwright_api.expect(job_row).to_have_count(0)
    assert page.evaluate("window.__same_page") is True
    assert running.evaluate("Number(document.body.dataset.updates)") >= 2
    running.close()


def test_requeue_from_the_dead_letter_page(served, page, queue):
    """A queue no supervisor serves: the requeued job stays in pending for the check."""
    _, web = served
    job = queue.enqueue("tests.fatal", priority=9)
    lease = leasing(queue).claim("browser-test:1", 1, 60_000).leases[0]
    leasing(queue).fail(lease.id, lease.token, {"reason": "refused"}, mode="fatal")
    page.goto(f"{web.url}/queues/{queue.name}/dead")
    page.locator(f'input[name="id"][value="{job.id}"]').check()
    page.get_by_role("button", name="requeue selected").click()
    playwright_api.expect(page.locator(".done")).to_contain_text("requeued 1 dead job")
    assert queue.get(job.id).state == "pending"
    assert queue.redis.zscore(queue.keys.pending, job.id) is not None


def test_filter_the_dead_list_requeue_every_match_and_run_a_delayed_job_now(served, page,
                                                                          queue):
    """A queue no supervisor serves: what the buttons did stays visible in Redis."""
    _, web = served
    dead = []
    for message in ("upstream timeout", "upstream timeout", "bad input"):
        queue.enqueue("tests.fail", priority=9)
        lease = leasing(queue).claim("browser-test:1", 1, 60_000).leases[0]
        leasing(queue).fail(lease.id, lease.token, {"type": "IOError", "message": message},
                            mode="fatal")
        dead.append(lease.id)
    page.goto(f"{web.url}/queues/{queue.name}/dead")
    page.locator('form.filters input[name="error"]').fill("time.ut$")
    page.get_by_role("button", name="filter").click()
    playwright_api.expect(page.locator("tr[data-job]")).to_have_count(2)
    page.get_by_role("button", name="requeue every match").click()
    playwright_api.expect(page.locator(".done")).to_contain_text("requeued 2 of 2 jobs matching")
    assert [queue.get(j).state for j in dead] == ["pending", "pending", "dead"]

    later = queue.enqueue("tests.echo", delay="1h")
    page.goto(f"{web.url}/jobs/{queue.name}/{later.id}")
    page.get_by_role("button", name="run now").click()
    playwright_api.expect(page.locator(".done")).to_contain_text("promoted job")
    playwright_api.expect(page.locator("h1 .state")).to_have_text("pending")
    assert queue.get(later.id).state == "pending"


def test_pause_from_the_page_stops_claiming(served, page, r):
    """Pause from the queue page, enqueue while a supervisor serves the queue: the job
    stays pending (and the overview says paused, live); resume from the page: it runs."""
    name, web = served
    queue = Queue(name, redis=r)
    gate = os.path.join(tempfile.mkdtemp(), "gate")
    page.goto(f"{web.url}/queues/{name}/pending")
    page.get_by_role("button", name="pause claiming").click()
    playwright_api.expect(page.locator(".done")).to_contain_text(f"paused {name}")
    playwright_api.expect(page.locator("h1 .badge.paused")).to_have_text("paused")
    assert queue.is_paused()

    overview = page.context.new_page()
    overview.goto(web.url + "/")
    row = overview.locator(f'tr[data-queue="{name}"]')
    playwright_api.expect(row.locator(".badge.paused")).to_have_text("paused")

    waiting = queue.enqueue("tests.wait_file", gate, timeout="30s")
    # the supervisor was woken by the enqueue and has two free slots; its heartbeat
    # record (every 2 s) refreshing twice shows its loop kept turning meanwhile
    beats: list[bytes] = []

    def heartbeats() -> bool:
        raw = r.hget("forq:supervisors", web.supervisor_id)
        if raw and (not beats or raw != beats[-1]):
            beats.append(raw)
        return len(beats) >= 3

    wait_for(heartbeats, timeout=20, message="two heartbeats while paused")
    assert queue.get(waiting.id).state == "pending"
    playwright_api.expect(row.locator("td.pending")).to_have_text("1")

    page.get_by_role("button", name="resume claiming").click()
    playwright_api.expect(page.locator(".done")).to_contain_text(f"resumed {name}")
    wait_job(queue, waiting.id, ("active",))
    playwright_api.expect(row.locator(".badge.paused")).to_have_count(0)
    open(gate, "w").close()
    wait_job(queue, waiting.id, ("succeeded",))
    overview.close()


def test_read_only_dashboard_has_no_action_buttons(redis_url, page, queue):
    job = queue.enqueue("tests.fatal", priority=9)
    lease = leasing(queue).claim("browser-test:1", 1, 60_000).leases[0]
    leasing(queue).fail(lease.id, lease.token, {"reason": "refused"}, mode="fatal")
    pending = queue.enqueue("tests.echo")
    with WebProcess(redis_url, "--read-only") as web:
        for path in (f"/queues/{queue.name}/dead", f"/jobs/{queue.name}/{job.id}",
                     f"/jobs/{queue.name}/{pending.id}", f"/queues/{queue.name}/pending", "/"):
            page.goto(web.url + path)
            playwright_api.expect(page.locator("header .badge")).to_have_text("read-only")
            # the one button left is the list's filter (a GET: it only reads)
            assert page.locator("button:not(form.filters *)").count() == 0, path
            assert page.locator("form[method=post]").count() == 0, path
        # and a hand-made POST from the page itself is refused
        status = page.evaluate(f"""fetch('/queues/{queue.name}/dead/requeue', {{method: 'POST',
            headers: {{'Content-Type': 'application/x-www-form-urlencoded'}},
            body: 'scope=all'}}).then(r => r.status)""")
        assert status == 403
    assert queue.get(job.id).state == "dead"


def test_post_without_csrf_token_from_the_page_is_refused(served, page, queue):
    _, web = served
    page.goto(f"{web.url}/queues/{queue.name}/pending")
    status = page.evaluate(f"""fetch('/queues/{queue.name}/limits', {{method: 'POST',
        headers: {{'Content-Type': 'application/x-www-form-urlencoded'}},
        body: 'max_in_flight=3'}}).then(r => r.status)""")
    assert status == 403 and queue.limits() == {}
    page.locator("details.limits-form summary").click()
    page.locator('input[name="max_in_flight"]').fill("3")
    page.get_by_role("button", name="set limits").click()
    playwright_api.expect(page.locator(".done")).to_contain_text("max_in_flight 3")
    wait_for(lambda: queue.limits().get("max_in_flight") == 3, message="limit set")
