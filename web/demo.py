"""`make web`: demo traffic plus the dashboard, in one command.

Starts a private Redis, two supervisors (three queues, a cron schedule), a producer of
mixed example jobs (quick, slow, CPU-heavy, memory-hungry, flaky, a few that crash or
die) and `forq web`, prints the dashboard's URL and runs until Ctrl-C or SIGTERM (or
``--duration``), then stops every one of them. ``--screenshots DIR`` lets the traffic
build up, then saves the overview and "running now" pages as PNGs from headless
Chromium (the pictures in docs/images come from here) and stops.

    python -m forq.web.demo [--port 8080] [--duration 10m] [--screenshots DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from forq import Queue
from forq.store.connection import connect
from forq.testing.demos import Stopped, say, signals_stop, stop_all
from forq.testing.redis import RedisServer
from forq.testing.supervisor import SupervisorProcess, write_config
from forq.units import parse_duration

REPO = Path(__file__).resolve().parent.parent

SUPERVISORS = {
    "web-1": {"emails": 4, "images": 3},
    "web-2": {"images": 2, "reports": 3},
}
SCHEDULES = """
[[schedule]]
name = "hourly-report"
cron = "0 * * * *"
queue = "reports"
task = "examples.report"

[[schedule]]
name = "heartbeat-report"
cron = "@every 30s"
queue = "reports"
task = "examples.report"
"""


def _config(directory: Path, url: str, name: str, queues: dict[str, int]) -> Path:
    return write_config(directory / f"{name}.toml", url, queues, name=name,
                        imports=["forq.examples"], lease_ttl="10s", reaper_interval="1s",
                        drain_timeout="3s", memory_sample_interval="50ms",
                        max_crashes=2, backoff='{ base = "2s", factor = 2.0, max = "30s" }',
                        supervisor_extra='job_cgroups = "off"', extra=SCHEDULES)


def produce(url: str, stop: threading.Event, rate: float) -> None:
    """Mixed example jobs at about `rate` per second until `stop` is set."""
    client = connect(url)
    queues = {name: Queue(name, redis=client) for name in ("emails", "images", "reports")}
    rng = random.Random(16)
    queues["images"].set_limits(max_in_flight=4)
    queues["emails"].set_limits(rate=(20, 1))
    while not stop.is_set():
        roll = rng.random()
        if roll < 0.45:
            queues["emails"].enqueue("examples.sleep", round(rng.uniform(0.2, 2.5), 2))
        elif roll < 0.55:
            queues["emails"].enqueue("examples.flaky", 2, backoff={"base": "1s"})
        elif roll < 0.75:
            queues["images"].enqueue("examples.hog", rng.choice((24, 48, 96)), 8,
                                     memory_limit="128MiB")
        elif roll < 0.83:
            queues["reports"].enqueue("examples.sleep", round(rng.uniform(5, 25), 1),
                                      timeout="20s")
        elif roll < 0.90:
            queues["reports"].enqueue("examples.burn", round(rng.uniform(1, 4), 1))
        elif roll < 0.94:
            queues["images"].enqueue("examples.hog", 400, 16, memory_limit="96MiB",
                                     max_attempts=1)
        elif roll < 0.97:
            queues["emails"].enqueue("examples.segfault", max_crashes=1)
        else:
            queues["reports"].enqueue("examples.add", 1, 2, delay=f"{rng.randint(10, 300)}s")
        stop.wait(rng.expovariate(rate))


def screenshots(base_url: str, directory: Path) -> list[Path]:
    """The overview and "running now" pages, as a 1400 px wide browser shows them."""
    from playwright.sync_api import sync_playwright

    directory.mkdir(parents=True, exist_ok=True)
    flags = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    saved = []
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context = p.chromium.launch_persistent_context(
            profile, executable_path="/usr/bin/chromium", headless=True, args=flags,
            viewport={"width": 1400, "height": 300}, device_scale_factor=1)
        page = context.new_page()
        for name, path in (("overview", "/"), ("running", "/running")):
            page.goto(base_url + path)
            deadline = time.monotonic() + 15  # two live updates in: the countdowns run
            while int(page.get_attribute("body", "data-updates") or 0) < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{path}: no live update within 15 s")
                page.wait_for_timeout(100)
            target = directory / f"{name}.png"
            page.screenshot(path=str(target), full_page=True)
            saved.append(target)
        context.close()
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m forq.web.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8080, help="dashboard port (8080)")
    parser.add_argument("--duration", default="0", help="stop after this long (0: Ctrl-C)")
    parser.add_argument("--rate", type=float, default=4.0, help="jobs enqueued per second (4)")
    parser.add_argument("--screenshots", metavar="DIR", type=Path,
                        help="save overview.png and running.png here after --warmup, then stop")
    parser.add_argument("--warmup", default="75s", help="traffic before the screenshots (75s)")
    args = parser.parse_args(argv)
    server: RedisServer | None = None
    procs: list[subprocess.Popen[bytes]] = []
    supervisors: list[SupervisorProcess] = []
    stop = threading.Event()
    producer: threading.Thread | None = None
    workdir = Path(tempfile.mkdtemp(prefix="forq-web-demo-"))  # the supervisors' configs
    with signals_stop():  # Ctrl-C or SIGTERM: stop everything started, then exit 0
        try:
            server = RedisServer()
            server.start()
            env = dict(os.environ, PYTHONPATH=str(REPO), FORQ_REDIS_URL=server.url)
            env.pop("FORQ_WEB_TOKEN", None)
            for name, queues in SUPERVISORS.items():
                sup = SupervisorProcess(_config(workdir, server.url, name, queues),
                                        env={"PYTHONPATH": str(REPO)})
                supervisors.append(sup)
                sup.start(wait_ready=False)
            say(f"Redis {server.url}; supervisors {', '.join(SUPERVISORS)} (logs: "
                f"{' '.join(str(sup.log_path) for sup in supervisors)})")
            producer = threading.Thread(target=produce, args=(server.url, stop, args.rate),
                                        daemon=True)
            producer.start()
            listen = f"127.0.0.1:{args.port}"
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "forq.supervisor.cli", "web", "--listen", listen],
                env=env, cwd=str(REPO)))
            return run(args, f"http://{listen}", procs, supervisors)
        except Stopped as exc:
            say(f"{exc}: stopping Redis, the supervisors and the web server")
            return 0
        finally:
            stop.set()
            if producer is not None:
                producer.join(timeout=5)  # before Redis goes: no error from a half-sent job
            stop_all([*(sup.proc for sup in supervisors), *procs])
            for sup in supervisors:
                sup.close_log()
            if server is not None:
                stop_all([server.proc])
                shutil.rmtree(server.dir, ignore_errors=True)
            shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace, url: str, procs: list[subprocess.Popen[bytes]],
        supervisors: list[SupervisorProcess]) -> int:
    """Screenshots, or traffic until --duration or a signal; 1 if a demo process died."""
    if args.screenshots:
        warmup = parse_duration(args.warmup, where="--warmup")
        say(f"dashboard at {url}/ — {warmup:g}s of traffic, then screenshots")
        time.sleep(warmup)
        for path in screenshots(url, args.screenshots):
            say(f"saved {path}")
        return 0
    duration = parse_duration(args.duration, where="--duration")
    say(f"dashboard at {url}/  (demo traffic at ~{args.rate:g} jobs/s; Ctrl-C stops)")
    deadline = time.monotonic() + duration if duration else None
    while deadline is None or time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs) or any(
                sup.proc is None or sup.proc.poll() is not None for sup in supervisors):
            say("a demo process exited; stopping")
            return 1
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
