"""forq's supervisor, end to end: no-op jobs/s through one supervisor (concurrency 2)
beside the raw fork limit of a process the same size measured in the same run,
pick-up latency, crash recovery, and the supervisor's RSS.

    .venv/bin/python -m bench.supervisor [--quick] [--url redis://...] [--json FILE]
    .venv/bin/python bench/supervisor.py            # the same

Without --url it starts a private redis-server on a free port. Every figure is the
median of several runs. Targets (issue 3): throughput >= 50% of the fork limit;
pick-up p50 <= 5 ms; child crash -> job pending again <= 1 s.

How each figure is taken:

* fork limit: `python -m bench.forkrate` imports what the supervisor imports, freezes
  its heap, pads its RSS to the supervisor's measured RSS, and times fork+_exit+waitpid.
* throughput: N `bench.noop` jobs are enqueued first, then a supervisor is started;
  the rate is taken from the first finished job to the last (the queue's `succeeded`
  counter, polled every 10 ms), so start-up is not counted. Each round runs it twice,
  with the queue's events (the default) and with `events = false`: the Redis commands
  and CPU per job between the two are what the events cost.
* latency: one `bench.stamp` job at a time on an idle supervisor; the handler returns
  `time.time()` at its start, compared with `time.time()` just before `enqueue`
  (same clock, µs resolution). The claim delay from the job record (Redis ms,
  `started_at - enqueued_at`) is kept beside it.
* child crash: a 20 s `bench.marked_sleep` job writes its pid to a file; its child is
  SIGKILLed from outside; "pending again" is the `reclaimed` entry of the job's history
  (Redis ms), "running again" the next start marker (µs).
* supervisor crash: the same, but the supervisor is SIGKILLed and a new one started at
  once (as systemd would): seconds until the job runs again (lease_ttl 5 s, reaper 1 s).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # `python bench/supervisor.py`
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path[0] = str(_Path(__file__).resolve().parent.parent)  # not bench/: `supervisor`
    __package__ = "bench"

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from bench.common import (
    FORQ_PYTHON,
    REPO,
    Counted,
    ForqSupervisor,
    RedisServer,
    command_calls,
    command_usec,
    commands_per_job,
    log,
    median,
    percentile,
    remove_queue,
    rss_bytes,
    summary,
    wait_until,
    workdir,
    write_forq_config,
)
from forq import Queue
from forq.store.connection import connect

TARGET_FORK_SHARE = 0.5
TARGET_P50_MS = 5.0
TARGET_CRASH_S = 1.0


def _queue_name(what: str) -> str:
    return f"bench-{what}-{uuid.uuid4().hex[:8]}"



def _tmpdir() -> Path:
    return workdir()


# -- the fork limit ---------------------------------------------------------------------


def fork_limit(pad_to: int = 0, forks: int = 1000, reps: int = 5) -> dict[str, Any]:
    """Raw fork+_exit+waitpid per second in a process the size of a supervisor."""
    out = subprocess.run(
        [FORQ_PYTHON, "-m", "bench.forkrate", "--pad-to", str(pad_to), "--forks", str(forks),
         "--reps", str(reps)],
        capture_output=True, text=True, cwd=str(REPO), check=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    return json.loads(out.stdout)


# -- throughput -------------------------------------------------------------------------


def _proc_stat(pid: int) -> dict[str, float]:
    """CPU seconds (user, system, reaped children's) and minor page faults of `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return {"user": int(fields[11]) / tick, "sys": int(fields[12]) / tick,
            "children": (int(fields[13]) + int(fields[14])) / tick,
            "minflt": int(fields[7]), "cminflt": int(fields[8])}


def _helpers_stat(pid: int) -> dict[int, dict[str, float]]:
    """`_proc_stat` of each live child process of `pid` (the fork server)."""
    import psutil

    out = {}
    try:
        kids = psutil.Process(pid).children()
    except psutil.Error:
        return out
    for kid in kids:
        try:
            out[kid.pid] = _proc_stat(kid.pid)
        except OSError:
            continue
    return out


def _helpers_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (own and reaped children's) of each live child process of `pid`: a
    long-lived helper (a fork server, say) is counted by the delta between two calls."""
    import psutil

    out = {}
    try:
        kids = psutil.Process(pid).children()
    except psutil.Error:
        return out
    for kid in kids:
        try:
            st = _proc_stat(kid.pid)
        except OSError:
            continue
        out[kid.pid] = st["user"] + st["sys"] + st["children"]
    return out


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """(own user+sys, reaped children's user+sys) CPU seconds of `pid`."""
    st = _proc_stat(pid)
    return st["user"] + st["sys"], st["children"]


def _redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


_ENQUEUE_NOOPS = """
import sys
from forq import Queue
url, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = Queue(name, url=url)
for start in range(0, n, 5000):
    q.enqueue_many([{"task": "bench.noop"}] * min(5000, n - start))
"""


def drain_once(url: str, n: int, concurrency: int = 2, workdir: Path | None = None,
               profile_to: Path | None = None, queue_extra: str = "",
               supervisor_extra: str = "", launcher: list[str] | None = None,
               producer: str | None = None, imports: tuple[str, ...] = ("bench.tasks",),
               env: dict[str, str] | None = None,
               keep_history: bool | None = True, python: str | None = None,
               task: str = "bench.noop") -> dict[str, Any]:
    """Enqueue n no-op jobs (of `task`: "bench.noop_chunk" for the chunked no-op), start
    a supervisor, time first finish → last finish.
    `launcher`: what runs `forq` (bench/cgroups.py starts it in a cgroup); `producer`:
    another venv's python that enqueues instead of this process (an older forq, whose
    data format this one would refuse — give it a Redis database of its own);
    `imports`: the handler modules; `env`: added to the supervisor's environment;
    `keep_history`: the config's (None: the default, a compact succeeded record);
    `python`: another checkout's venv python runs the supervisor (a baseline)."""
    workdir = workdir or _tmpdir()
    r = connect(url)
    name = _queue_name("e2e")
    q = Queue(name, redis=r)
    if producer:
        subprocess.run([producer, "-c", _ENQUEUE_NOOPS, url, name, str(n)], check=True)
    else:
        for start in range(0, n, 5000):
            q.enqueue_many([{"task": task}] * min(5000, n - start))
    cfg = write_forq_config(workdir / f"{name}.toml", url, name, concurrency,
                            queue_extra=queue_extra, supervisor_extra=supervisor_extra,
                            imports=imports, keep_history=keep_history)
    sup = ForqSupervisor(cfg, workdir / f"{name}.log", env=env)
    if python:
        sup.command = [python, *sup.command[1:]]
    if launcher:
        sup.command = [*launcher, *sup.command]
    stats_key = q.keys.stats
    spy = None
    try:
        sup.start(wait_ready=False)
        first = wait_until(lambda: int(r.hget(stats_key, "succeeded") or 0), 60, 0.002,
                           "first job done")
        t1 = time.perf_counter()
        cpu1 = _cpu_seconds(sup.pid)
        st1 = _proc_stat(sup.pid)
        helpers1 = _helpers_cpu(sup.pid)
        server1 = _helpers_stat(sup.pid)
        rcpu1 = _redis_cpu(r)
        calls1 = command_calls(r)
        usec1 = command_usec(r)
        if profile_to is not None:
            spy = _start_py_spy(sup.pid, profile_to)
        poll = Counted(lambda: int(r.hget(stats_key, "succeeded") or 0))
        done = wait_until(lambda: (c := poll()) >= n and c, max(120, n / 50), 0.01,
                          f"{n} jobs done")
        t2 = time.perf_counter()
        cpu2 = _cpu_seconds(sup.pid)
        st2 = _proc_stat(sup.pid)
        helpers2 = _helpers_cpu(sup.pid)
        server2 = _helpers_stat(sup.pid)
        helpers = sum(v - helpers1[k] for k, v in helpers2.items() if k in helpers1)
        rcpu2 = _redis_cpu(r)
        calls2 = command_calls(r)
        usec2 = command_usec(r)
        rss = sup.rss()
        helpers_rss = [rss_bytes(pid) or 0 for pid in helpers2]  # the fork server
        jobs = done - first
        seconds = t2 - t1
        started = re.search(r"fork server started in pid \d+ \(code .*?\): (.*)", sup.log())
        # the fork server itself, and the job children it reaped: CPU ms and faults a job
        split: dict[str, float] = {}
        for spid, b in server2.items():
            a = server1.get(spid)
            if a is not None:
                split = {"fork_server_cpu_ms_per_job":
                         (b["user"] + b["sys"] - a["user"] - a["sys"]) / jobs * 1000,
                         "fork_server_faults_per_job": (b["minflt"] - a["minflt"]) / jobs,
                         "child_cpu_ms_per_job": (b["children"] - a["children"]) / jobs * 1000,
                         "child_faults_per_job": (b["cminflt"] - a["cminflt"]) / jobs}
        return {
            "jobs": jobs, "seconds": seconds, "jobs_per_s": jobs / seconds,
            "supervisor_rss": rss, "fork_server_rss": max(helpers_rss, default=None),
            # what its start-up line said of its memory on huge pages
            "fork_server_pages": started.group(1).strip() if started else "",
            **split,
            "parent_cpu_ms_per_job": (cpu2[0] - cpu1[0]) / jobs * 1000,
            "parent_user_ms_per_job": (st2["user"] - st1["user"]) / jobs * 1000,
            "parent_sys_ms_per_job": (st2["sys"] - st1["sys"]) / jobs * 1000,
            "parent_minor_faults_per_job": (st2["minflt"] - st1["minflt"]) / jobs,
            "children_cpu_ms_per_job": (cpu2[1] - cpu1[1] + helpers) / jobs * 1000,
            "redis_cpu_ms_per_job": (rcpu2 - rcpu1) / jobs * 1000,
            "redis_commands_per_job": commands_per_job(calls1, calls2, jobs, {"hget": poll.calls}),
            # Redis's time in the scripts (the commands they ran included) a job
            "redis_script_us_per_job": sum(usec2.get(k, 0) - usec1.get(k, 0)
                                           for k in ("evalsha", "eval")) / jobs,
        }
    finally:
        if spy is not None:
            _stop_py_spy(spy)
        sup.stop()
        remove_queue(r, name)


def _start_py_spy(pid: int, out: Path) -> subprocess.Popen | None:
    binary = _py_spy()
    if binary is None:
        log("py-spy not found: no profile (pip install py-spy in bench/.venv-peers)")
        return None
    return subprocess.Popen([binary, "record", "--pid", str(pid), "--format", "raw",
                             "--rate", "500", "-o", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop_py_spy(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _py_spy() -> str | None:
    import shutil

    for candidate in (REPO / "bench" / ".venv-peers" / "bin" / "py-spy",
                      Path(sys.executable).parent / "py-spy"):
        if candidate.exists():
            return str(candidate)
    return shutil.which("py-spy")


def throughput_summary(runs: list[dict[str, Any]], n: int, concurrency: int = 2) -> dict[str, Any]:
    out = summary([x["jobs_per_s"] for x in runs])
    for k in ("supervisor_rss", "parent_cpu_ms_per_job", "children_cpu_ms_per_job",
              "redis_cpu_ms_per_job", "parent_user_ms_per_job", "parent_sys_ms_per_job",
              "parent_minor_faults_per_job", "fork_server_cpu_ms_per_job",
              "fork_server_faults_per_job", "child_cpu_ms_per_job", "child_faults_per_job"):
        out[k] = median(x.get(k) for x in runs)
    out["redis_commands_per_job"] = runs[-1]["redis_commands_per_job"]
    out["n"] = n
    out["concurrency"] = concurrency
    return out


def throughput(url: str, n: int, reps: int, concurrency: int = 2) -> dict[str, Any]:
    return throughput_summary([drain_once(url, n, concurrency) for _ in range(reps)], n,
                              concurrency)


EVENTS_OFF = "events = false\n"  # the [[queue]] line of the events-off runs


def throughput_events(url: str, n: int, reps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The end-to-end drain with the queue's events (the default) and without, rounds
    alternating, so the machine's load hits both alike."""
    on: list[dict[str, Any]] = []
    off: list[dict[str, Any]] = []
    for i in range(reps):
        for events in ((True, False) if i % 2 == 0 else (False, True)):
            (on if events else off).append(
                drain_once(url, n, queue_extra="" if events else EVENTS_OFF))
    return throughput_summary(on, n), throughput_summary(off, n)


# -- latency ----------------------------------------------------------------------------


def latency(url: str, samples: int, workdir: Path | None = None,
            queue_extra: str = "", keep_history: bool | None = True,
            python: str | None = None) -> dict[str, Any]:
    """Enqueue→handler start on an idle supervisor, one job at a time (`python`: as
    `drain_once`'s)."""
    workdir = workdir or _tmpdir()
    r = connect(url)
    name = _queue_name("lat")
    q = Queue(name, redis=r)
    cfg = write_forq_config(workdir / f"{name}.toml", url, name, 2, queue_extra=queue_extra,
                            keep_history=keep_history)
    sup = ForqSupervisor(cfg, workdir / f"{name}.log")
    if python:
        sup.command = [python, *sup.command[1:]]
    sup.start()
    start_ms, after_ms, claim_ms, enq_claim_ms, fork_ms = [], [], [], [], []
    try:
        time.sleep(0.5)  # idle: start-up work done
        q.enqueue("bench.noop")  # warm: scripts loaded on both sides
        time.sleep(0.2)
        for _ in range(samples):
            t0 = time.time()
            job = q.enqueue("bench.stamp")
            t1 = time.time()
            key = q.keys.job(job.id)
            rec = wait_until(lambda k=key: (h := r.hmget(k, "state", "result", "enqueued_at",
                                                         "started_at"))[0] == "succeeded" and h,
                             30, 0.002, "stamp job")
            start_ms.append((float(rec[1]) - t0) * 1000)
            after_ms.append((float(rec[1]) - t1) * 1000)
            claim_ms.append(int(rec[3]) - int(rec[2]))
            enq_claim_ms.append(int(rec[3]) - t0 * 1000)
            fork_ms.append(float(rec[1]) * 1000 - int(rec[3]))
            time.sleep(random.uniform(0.02, 0.05))  # idle again: children reaped
        idle_rss = sup.rss()
    finally:
        sup.stop()
        remove_queue(r, name)
    return {"samples": samples, "p50_ms": percentile(start_ms, 50),
            "p99_ms": percentile(start_ms, 99), "max_ms": max(start_ms),
            "claim_p50_ms": percentile(claim_ms, 50), "claim_p99_ms": percentile(claim_ms, 99),
            # split at the claim (Redis ms, so ±1 ms): enqueue call → claim script ran,
            # and claim → handler running (the reply, fork and the child's set-up)
            "to_claim_p50_ms": percentile(enq_claim_ms, 50),
            "claim_to_start_p50_ms": percentile(fork_ms, 50),
            "supervisor_rss_idle": idle_rss, "all_ms": [round(x, 3) for x in start_ms],
            "after_all_ms": [round(x, 3) for x in after_ms]}


# -- recovery ----------------------------------------------------------------------------


def _markers(path: Path) -> list[tuple[int, float]]:
    try:
        lines = path.read_text().split("\n")
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            out.append((int(parts[0]), float(parts[1])))
    return out


def _wait_markers(path: Path, count: int, timeout: float) -> list[tuple[int, float]] | None:
    try:
        return wait_until(lambda: len(m := _markers(path)) >= count and m, timeout, 0.002,
                          f"start marker {count}")
    except TimeoutError:
        return None


def child_crash(url: str, reps: int, workdir: Path | None = None) -> dict[str, Any]:
    """SIGKILL the child running a 20 s job: seconds until pending again / running again."""
    workdir = workdir or _tmpdir()
    r = connect(url)
    name = _queue_name("crash")
    q = Queue(name, redis=r)
    # lease 3 s: the cancel that ends each run's re-run lands within 1 s (extension period)
    cfg = write_forq_config(workdir / f"{name}.toml", url, name, 2, lease_ttl="3s")
    sup = ForqSupervisor(cfg, workdir / f"{name}.log").start()
    pending_s, running_s = [], []
    try:
        for i in range(reps):
            marker = workdir / f"{name}-{i}.marks"
            job = q.enqueue("bench.marked_sleep", str(marker), 20)
            first = _wait_markers(marker, 1, 10)
            assert first, "the job never started"
            t_kill = time.time()
            os.kill(first[0][0], signal.SIGKILL)
            again = _wait_markers(marker, 2, 10)
            running_s.append(again[1][1] - t_kill if again else None)
            hist = q.get(job.id).history
            reclaimed = [h["at"] for h in hist if isinstance(h, dict)
                         and h.get("event") == "reclaimed"]
            pending_s.append(max(0.0, reclaimed[0] - t_kill) if reclaimed else None)
            q.cancel(job.id)
            wait_until(lambda j=job.id: q.get(j).state in ("cancelled", "dead", "succeeded"),
                       10, 0.05, "cancelled")
    finally:
        sup.stop()
        remove_queue(r, name)
    return {"reps": reps, "pending_again_s": summary(pending_s),
            "running_again_s": summary(running_s)}


def supervisor_crash(url: str, reps: int, lease_ttl: float = 5.0, reaper: float = 1.0,
                     workdir: Path | None = None) -> dict[str, Any]:
    """SIGKILL the supervisor running a 20 s job and start a new one at once (as systemd
    would): seconds until the job runs again. Its child dies with it (PDEATHSIG)."""
    workdir = workdir or _tmpdir()
    r = connect(url)
    name = _queue_name("supkill")
    q = Queue(name, redis=r)
    cfg = write_forq_config(workdir / f"{name}.toml", url, name, 2,
                            lease_ttl=f"{lease_ttl:g}s", reaper_interval=f"{reaper:g}s")
    running_s, orphans = [], []
    try:
        for i in range(reps):
            marker = workdir / f"{name}-{i}.marks"
            a = ForqSupervisor(cfg, workdir / f"{name}-a{i}.log").start()
            job = q.enqueue("bench.marked_sleep", str(marker), 20)
            first = _wait_markers(marker, 1, 10)
            assert first, "the job never started"
            t_kill = time.time()
            os.kill(a.pid, signal.SIGKILL)
            a.proc.wait()
            b = ForqSupervisor(cfg, workdir / f"{name}-b{i}.log").start(wait_ready=False)
            try:
                time.sleep(0.2)
                orphans.append(rss_bytes(first[0][0]) is not None)  # the child outlived it?
                again = _wait_markers(marker, 2, lease_ttl + reaper + 15)
                running_s.append(again[1][1] - t_kill if again else None)
                q.cancel(job.id)
            finally:
                b.stop()
    finally:
        remove_queue(r, name)
    return {"reps": reps, "lease_ttl_s": lease_ttl, "reaper_interval_s": reaper,
            "running_again_s": summary(running_s), "orphaned_child": any(orphans)}


# -- the whole section ------------------------------------------------------------------------


def idle_rss(url: str) -> int | None:
    workdir = _tmpdir()
    name = _queue_name("rss")
    cfg = write_forq_config(workdir / f"{name}.toml", url, name, 2)
    with ForqSupervisor(cfg, workdir / f"{name}.log") as sup:
        time.sleep(1.0)
        return sup.rss()


def run_all(url: str, quick: bool = False) -> dict[str, Any]:
    n = 2000 if quick else 5000
    reps = 2 if quick else 3
    log("supervisor: RSS at idle ...")
    rss = idle_rss(url)
    log(f"supervisor: fork limit at {rss / 2**20:.1f} MiB ...")
    limit = fork_limit(pad_to=rss or 0, forks=500 if quick else 1000)
    log(f"supervisor: {n} no-op jobs x {reps}, events on and off ...")
    tput, tput_off = throughput_events(url, n, reps)
    log("supervisor: pick-up latency ...")
    lat = latency(url, 30 if quick else 100)
    log("supervisor: child crash recovery ...")
    crash = child_crash(url, reps)
    log("supervisor: supervisor crash recovery ...")
    supkill = supervisor_crash(url, 1 if quick else 2)
    return {"fork_limit": limit, "throughput": tput, "throughput_events_off": tput_off,
            "latency": lat, "child_crash": crash,
            "supervisor_crash": supkill, "supervisor_rss_idle": rss,
            "fork_share": tput["median"] / limit["forks_per_s"]}


def verdicts(res: dict[str, Any]) -> dict[str, bool]:
    return {
        "fork_share": res["fork_share"] >= TARGET_FORK_SHARE,
        "latency_p50": res["latency"]["p50_ms"] <= TARGET_P50_MS,
        "crash_pending": (res["child_crash"]["pending_again_s"]["median"] or 99) <= TARGET_CRASH_S,
    }


def print_table(res: dict[str, Any]) -> None:
    v = verdicts(res)
    ok = {True: "met", False: "MISSED"}
    t, lat, c, s = res["throughput"], res["latency"], res["child_crash"], res["supervisor_crash"]
    off = res["throughput_events_off"]
    lim = res["fork_limit"]
    rows = [
        ("fork+_exit+waitpid limit (same RSS)", f"{lim['forks_per_s']:,.0f} /s",
         f"at {lim['rss'] / 2**20:.1f} MiB", ""),
        ("no-op jobs end to end, concurrency 2", f"{t['median']:,.0f} jobs/s",
         f"{res['fork_share']:.0%} of the fork limit", f">= 50%: {ok[v['fork_share']]}"),
        ("  supervisor CPU per job", f"{t['parent_cpu_ms_per_job']:.2f} ms",
         f"{t['parent_user_ms_per_job']:.2f} user + {t['parent_sys_ms_per_job']:.2f} sys, "
         f"{t['parent_minor_faults_per_job']:.0f} page faults", ""),
        ("  child / Redis CPU per job", f"{t['children_cpu_ms_per_job']:.2f} ms",
         f"Redis {t['redis_cpu_ms_per_job']:.2f} ms; bare fork: parent "
         f"{lim.get('parent_cpu_ms_per_fork', 0):.2f}, child {lim.get('child_cpu_ms_per_fork', 0):.2f} ms", ""),
        ("  the same, the queue's events off", f"{off['median']:,.0f} jobs/s",
         f"events cost {t['redis_commands_per_job']['total'] - off['redis_commands_per_job']['total']:+.1f} "
         f"commands, {(t['redis_cpu_ms_per_job'] - off['redis_cpu_ms_per_job']) * 1000:+.0f} µs "
         f"Redis CPU per job", ""),
        ("pick-up latency p50 / p99", f"{lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} ms",
         f"to claim {lat['to_claim_p50_ms']:.1f} ms, claim→handler {lat['claim_to_start_p50_ms']:.1f} ms",
         f"p50 <= 5 ms: {ok[v['latency_p50']]}"),
        ("child crash → pending again", f"{c['pending_again_s']['median']:.3f} s",
         f"running again {c['running_again_s']['median']:.3f} s", f"<= 1 s: {ok[v['crash_pending']]}"),
        ("supervisor SIGKILL → running again", f"{s['running_again_s']['median']:.2f} s",
         f"lease_ttl {s['lease_ttl_s']:g} s + reaper {s['reaper_interval_s']:g} s", ""),
        ("supervisor RSS idle / after drain",
         f"{res['supervisor_rss_idle'] / 2**20:.1f} / {t['supervisor_rss'] / 2**20:.1f} MiB", "", ""),
    ]
    w = max(len(r[0]) for r in rows)
    for name, value, note, target in rows:
        print(f"{name:<{w}}  {value:>18}  {note:<52} {target}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--url", help="an existing Redis (default: start a private one)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    server = None
    url = args.url
    if url is None:
        server = RedisServer().start()
        url = server.url()
    try:
        res = run_all(url, args.quick)
    finally:
        if server is not None:
            server.stop()
    print_table(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
