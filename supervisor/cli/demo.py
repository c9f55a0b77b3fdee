"""`make demo`: a supervisor on etc/forq.toml processing the example jobs — quick ones,
a CPU-heavy one, a flaky one, one over its memory limit, one over its time limit, a
poison job that segfaults every time, a delayed one, a vote with a follow-up — then
SIGTERM and a graceful drain. Finishes within a minute. Ctrl-C or SIGTERM stops it
early, and with it the supervisor and the private Redis it started (exit 130 or 143).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from forq import Queue
from forq.job import TERMINAL
from forq.store.connection import connect
from forq.supervisor.cli import render
from forq.testing.demos import Stopped, exit_code, say, signals_stop, stop_all
from forq.testing.redis import RedisServer, free_port, reachable

REPO = Path(__file__).resolve().parents[2]  # supervisor/cli/demo.py
CONFIG = REPO / "etc" / "forq.toml"


def demo_config() -> Path:
    """etc/forq.toml as shipped, with the metrics port moved to a free one so the demo
    never collides with a supervisor already running here."""
    port = free_port()
    text = CONFIG.read_text()
    text = re.sub(r'listen = "127\.0\.0\.1:\d+"', f'listen = "127.0.0.1:{port}"', text)
    fd, path = tempfile.mkstemp(prefix="forq-demo-", suffix=".toml")
    os.write(fd, text.encode())
    os.close(fd)
    return Path(path)


def enqueue_examples(q: Queue) -> list[tuple[str, str]]:
    """(label, job id) for every example job."""
    jobs = []

    def add(label: str, task: str, *args, **options) -> None:
        jobs.append((label, q.enqueue(task, *args, **options).id))

    for i in range(4):
        add(f"quick #{i + 1}", "examples.add", i, 10)
    add("cpu-heavy", "examples.hash", 300_000)
    add("flaky (3rd try)", "examples.flaky", 3, backoff={"base": "300ms", "jitter": 0.1})
    add("over memory", "examples.hog", 400, memory_limit="64MiB", max_attempts=2,
        backoff={"base": "200ms"})
    add("over time", "examples.sleep", 30, timeout="1500ms", max_attempts=2,
        backoff={"base": "200ms"})
    add("segfaults", "examples.segfault", max_crashes=3)
    add("delayed 3s", "examples.add", 1, 2, delay="3s")
    add("vote+follow-up", "examples.vote", "post-42", "ada")
    add("unknown task", "examples.nope")
    return jobs


def show(q: Queue, jobs: list[tuple[str, str]]) -> None:
    rows = [("job", "id", "task", "state", "attempts", "crashes", "result / reason")]
    for label, jid in jobs:
        try:
            job = q.get(jid)
        except Exception as exc:  # noqa: BLE001 — the demo shows, never crashes
            rows.append((label, jid, "?", "?", "", "", str(exc)))
            continue
        outcome = job.fields.get("result") if job.state == "succeeded" else (job.reason or "")
        rows.append((label, jid[:10], job.task, job.state, str(job.attempts), str(job.crashes),
                     str(outcome)[:60]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def main() -> int:
    url = os.environ.get("FORQ_REDIS_URL", "redis://127.0.0.1:6379/0")
    server: RedisServer | None = None
    supervisors: list[subprocess.Popen[bytes]] = []
    config: Path | None = None
    with signals_stop():  # Ctrl-C or SIGTERM: stop what was started, then exit
        try:
            if not reachable(url):
                try:
                    server = RedisServer()
                    server.start()
                except RuntimeError as exc:
                    print(f"forq demo: no Redis at {url}, and {exc}", file=sys.stderr)
                    return 1
                url = server.url
                say(f"no Redis at the configured URL; started a private one at {url}")
            env = dict(os.environ, FORQ_REDIS_URL=url, PYTHONPATH=str(REPO))
            config = demo_config()
            return run_demo(url, env, config, supervisors)
        except Stopped as exc:
            say(f"{exc}: stopping the supervisor{' and Redis' if server else ''} the demo started")
            return exit_code(exc)
        finally:
            stop_all(supervisors)
            if server is not None:
                stop_all([server.proc])
                shutil.rmtree(server.dir, ignore_errors=True)
            if config is not None:
                config.unlink(missing_ok=True)


def run_demo(url: str, env: dict[str, str], config: Path,
             supervisors: list[subprocess.Popen[bytes]]) -> int:
    """The tour; the supervisor it starts goes into `supervisors` (stopped by `main`)."""
    say(f"starting a supervisor: forq run --config {CONFIG.relative_to(REPO)}")
    sup = subprocess.Popen([sys.executable, "-m", "forq.supervisor.cli", "run", "--config",
                            str(config)], env=env, cwd=str(REPO))
    supervisors.append(sup)
    client = connect(url)
    q = Queue("default", redis=client)
    say("enqueueing the example jobs")
    jobs = enqueue_examples(q)
    drain_job = None
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        states = [q.get(jid).state for _, jid in jobs]
        if all(s in TERMINAL for s in states):
            break
        time.sleep(0.25)
    say("every example job has finished:")
    show(q, jobs)
    say("queue stats (forq stats):")
    print(render.stats_table({"default": q.stats()}))
    say("enqueueing a 3-second job, then SIGTERM: the supervisor drains")
    drain_job = q.enqueue("examples.sleep", 3).id
    while q.get(drain_job).state != "active" and time.monotonic() < deadline + 10:
        time.sleep(0.05)
    sup.send_signal(signal.SIGTERM)
    code = sup.wait(timeout=60)
    say(f"supervisor exited with code {code}; the running job finished first:")
    show(q, [("drained job", drain_job)])
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
