"""The shipped units under a real systemd (PID 1 of the test VM, tests/systemd_vm.py),
checked with systemctl and journalctl as an operator would.

On the host, `test_the_units_under_a_real_systemd` boots the VM once and runs this file
inside it, where the other tests run in order against two instances, forq@a and forq@b,
and Debian's own redis-server.service. Elsewhere those tests skip.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forq import Queue
from forq.store.connection import connect
from tests import background
from tests.helpers import wait_for

IN_VM = os.environ.get("FORQ_IN_SYSTEMD_VM") == "1"
QUEUE = "vm"
REDIS = "redis://127.0.0.1:6379/0"
UNIT_CGROUP = "/sys/fs/cgroup/system.slice/system-forq.slice/forq@{}.service"
TERMINAL = ("succeeded", "dead", "cancelled")

in_vm = pytest.mark.skipif(not IN_VM, reason="runs under systemd in the VM "
                                             "(test_the_units_under_a_real_systemd)")


def sh(*argv: str, check: bool = True, timeout: float = 150) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode:
        raise AssertionError(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stdout}"
                             f"{proc.stderr}")
    return proc


def show(unit: str, prop: str) -> str:
    return sh("systemctl", "show", "-P", prop, unit).stdout.strip()


def journal(unit: str) -> str:
    return sh("journalctl", "-u", unit, "-o", "cat", "--no-pager").stdout


def write_config(name: str, concurrency: int = 2, port: int = 0, extra: str = "",
                 imports: tuple[str, ...] = (), lease_ttl: str = "8s") -> None:
    Path(f"/etc/forq/{name}.toml").write_text(f"""
[redis]
url = "{REDIS}"
[supervisor]
name = "{name}"
lease_ttl = "{lease_ttl}"
reaper_interval = "1s"
drain_timeout = "60s"
imports = {json.dumps(["forq.examples", "forq_test_tasks", *imports])}
{extra}
[defaults]
keep_history = true  # the tests read succeeded jobs' histories (claims, crashes)
[[queue]]
name = "{QUEUE}"
concurrency = {concurrency}
[metrics]
listen = "{f'127.0.0.1:{port}' if port else ''}"
""")


def queue() -> Queue:
    return Queue(QUEUE, redis=connect(REDIS))


def done(job_id: str, timeout: float = 120):
    q = queue()
    return wait_for(lambda: (j := q.get(job_id)).state in TERMINAL and j, timeout=timeout,
                    interval=0.2, message=f"job {job_id} done")


def running(job_id: str, timeout: float = 90) -> None:
    q = queue()
    wait_for(lambda: q.get(job_id).state == "active", timeout=timeout, interval=0.2,
             message=f"job {job_id} active")


def claims(job) -> list[str]:
    return [e.get("owner", "") for e in job.history if e["event"] == "claimed"]


@in_vm
def test_start_with_redis_down_is_ready_and_waits_then_serves():
    sh("systemctl", "stop", "redis-server")
    write_config("a", port=9464)
    sh("systemctl", "start", "forq@a")  # returns once READY=1 arrived
    assert show("forq@a", "ActiveState") == "active"
    assert show("forq@a", "StatusText") == "waiting for Redis at 127.0.0.1:6379/0"
    assert "redis at 127.0.0.1:6379/0 (from [redis].url in /etc/forq/a.toml)" in \
        journal("forq@a")
    sh("systemctl", "start", "redis-server")
    wait_for(lambda: show("forq@a", "StatusText") == "running: 0/2 busy", timeout=60,
             interval=0.5, message="serving once Redis is up")


@in_vm
def test_jobs_run_hardened_in_per_job_cgroups_and_an_oom_kill_keeps_the_unit():
    q = queue()
    base = UNIT_CGROUP.format("a")
    assert f"memory limits by per-job cgroups under {base}" in journal("forq@a")
    job = done(q.enqueue("tests.cgroup", memory_limit="96MiB").id)
    assert job.state == "succeeded", job.history
    assert re.fullmatch(rf"{re.escape(base)}/job-{job.id}\.\d+", job.result["cgroup"]), job.result
    assert job.result["memory_max"] == str(96 << 20)
    who = done(q.enqueue("tests.whoami").id).result
    assert who["uid"] != 0 and "NOTIFY_SOCKET" not in who["env"], who

    slow = q.enqueue("examples.sleep", 6).id
    running(slow)
    wait_for(lambda: show("forq@a", "StatusText") == "running: 1/2 busy", timeout=30,
             interval=0.5, message="Status: shows the busy slot")
    hog = done(q.enqueue("examples.hog", kwargs={"megabytes": 300, "step": 8},
                         memory_limit="64MiB", max_attempts=1).id)
    assert hog.state == "dead" and "OOM-killed in its cgroup" in hog.reason, hog.reason
    assert done(slow).state == "succeeded"
    assert show("forq@a", "ActiveState") == "active"
    assert show("forq@a", "NRestarts") == "0"


@in_vm
def test_reload_applies_a_good_config_and_refuses_a_bad_one():
    write_config("a", concurrency=3, port=9464)
    sh("systemctl", "reload", "forq@a")
    wait_for(lambda: show("forq@a", "StatusText") == "running: 0/3 busy", timeout=30,
             interval=0.5, message="the reloaded concurrency")
    assert "reloaded /etc/forq/a.toml" in journal("forq@a")
    Path("/etc/forq/a.toml").write_text("[supervisor\n")
    sh("systemctl", "reload", "forq@a")
    wait_for(lambda: "reload refused" in journal("forq@a"), timeout=30, interval=0.5,
             message="the bad config refused")
    assert show("forq@a", "ActiveState") == "active"
    assert show("forq@a", "NRestarts") == "0"
    assert done(queue().enqueue("examples.add", 1, 2).id).result == 3
    write_config("a", port=9464)


APP = Path("/opt/forq-app")  # the handler code a deploy replaces (read-only to the unit)
APP_MODULE = """
import os
import time

from forq import task

VERSION = {version}


@task("vmapp.version")
def version(seconds: float = 0.0):
    time.sleep(seconds)
    return {{"version": VERSION, "pid": os.getpid(), "ppid": os.getppid()}}
"""


def deploy(version: int) -> None:
    APP.mkdir(exist_ok=True)
    (APP / "vmapp.py").write_text(APP_MODULE.format(version=version))


def supervisor_record(name: str) -> dict:
    from forq.fleet import live_supervisors

    return next(r for r in live_supervisors(connect(REDIS)) if r.get("name") == name)


@in_vm
def test_reload_runs_new_code_for_new_jobs_and_interrupts_none():
    """`systemctl reload` under load: a 60 s job started before it finishes in the old
    code and its old fork server, which then goes; jobs that start after it run the new
    files; no job is interrupted or run twice."""
    from forq.testing.supervisor import fork_servers_of

    deploy(1)
    Path("/etc/forq/a.env").write_text(f"PYTHONPATH={APP}\n")  # read at start
    # a lease that survives the emulated VM's stalls beside a loaded host's test suite:
    # this test is about the reload, not fencing
    write_config("a", concurrency=4, port=9464, imports=("vmapp",), lease_ttl="30s")
    sh("systemctl", "restart", "forq@a")
    q = queue()
    assert done(q.enqueue("vmapp.version").id).result["version"] == 1
    pid = int(show("forq@a", "MainPID"))
    (old,) = fork_servers_of(pid)
    long = q.enqueue("vmapp.version", 60).id
    running(long)
    old_code = q.get(long).fields["code"]
    before = [q.enqueue("vmapp.version", 0.5).id for _ in range(12)]  # the load
    running(before[0])

    deploy(2)
    sh("systemctl", "reload", "forq@a")
    new_code = wait_for(lambda: (c := supervisor_record("a")["code"]) != old_code and c,
                        timeout=60, interval=0.2, message="the reload's new code")
    after = [q.enqueue("vmapp.version", 0.1).id for _ in range(12)]
    (new,) = [p for p in fork_servers_of(pid) if p != old]
    # the old fork server retires with the long job once the load's last jobs there end
    # (under a loaded host the record can be published while some of them still run)
    retiring = [{"code": old_code, "pid": old, "jobs": 1}]
    wait_for(lambda: supervisor_record("a")["code_retiring"] == retiring, timeout=60,
             interval=0.2, message="the old fork server retiring with the long job only")

    for jid in before + after:
        job = done(jid)
        assert job.state == "succeeded" and len(claims(job)) == 1 and job.crashes == 0, \
            job.history
        # its record names the code it ran: the old files in the old fork server, or the new
        assert job.fields["code"] in (old_code, new_code), job.fields
        ran = (1, old) if job.fields["code"] == old_code else (2, new)
        assert (job.result["version"], job.result["ppid"]) == ran, (job.fields, job.result)
    assert all(done(jid).result["version"] == 2 for jid in after)
    assert q.get(long).state == "active" and old in fork_servers_of(pid)

    job = done(long, timeout=180)
    assert job.state == "succeeded" and len(claims(job)) == 1 and job.crashes == 0, job.history
    assert (job.result["version"], job.result["ppid"]) == (1, old), job.result
    assert job.fields["code"] == old_code
    wait_for(lambda: fork_servers_of(pid) == [new], timeout=30, interval=0.2,
             message="the old fork server gone with its last job")
    assert f"old fork server {old} stopped" in journal("forq@a")
    assert int(show("forq@a", "MainPID")) == pid and show("forq@a", "NRestarts") == "0"
    write_config("a", port=9464)
    sh("systemctl", "reload", "forq@a")


@in_vm
def test_stop_lets_the_running_job_finish_and_exits_0():
    jid = queue().enqueue("examples.sleep", 5).id
    running(jid)
    started = time.monotonic()
    sh("systemctl", "stop", "forq@a")
    assert time.monotonic() - started < 90  # TimeoutStopSec
    job = queue().get(jid)
    assert job.state == "succeeded" and len(claims(job)) == 1, job.history
    assert show("forq@a", "Result") == "success"
    assert show("forq@a", "ExecMainStatus") == "0"


@in_vm
def test_a_killed_supervisor_jobs_are_reclaimed_by_another_instance():
    write_config("b", port=9465)
    sh("systemctl", "start", "forq@a", "forq@b")
    jid = queue().enqueue("examples.sleep", 20).id
    running(jid)
    pids = {name: show(f"forq@{name}", "MainPID") for name in "ab"}
    victim = next(n for n in "ab" if claims(queue().get(jid))[0].endswith(f":{pids[n]}"))
    other = "b" if victim == "a" else "a"
    sh("systemctl", "kill", "--kill-who=main", "--signal=SIGKILL", f"forq@{victim}")
    job = done(jid, timeout=180)
    assert job.state == "succeeded" and job.crashes == 1, job.history
    assert claims(job)[1].endswith(f":{pids[other]}"), (pids, job.history)
    wait_for(lambda: show(f"forq@{victim}", "ActiveState") == "active", timeout=120,
             interval=1, message=f"forq@{victim} restarted (Restart=on-failure)")
    assert show(f"forq@{victim}", "NRestarts") == "1"


@in_vm
def test_a_stopped_supervisor_is_restarted_by_the_watchdog_and_its_job_runs_again():
    sh("systemctl", "stop", "forq@b")
    wait_for(lambda: show("forq@a", "StatusText").startswith("running: 0/"), timeout=60,
             interval=0.5, message="forq@a serving")
    restarts = int(show("forq@a", "NRestarts"))
    jid = queue().enqueue("examples.sleep", 20).id
    running(jid)
    os.kill(int(show("forq@a", "MainPID")), signal.SIGSTOP)
    wait_for(lambda: int(show("forq@a", "NRestarts")) == restarts + 1, timeout=90,
             interval=1, message="the watchdog's restart")
    # systemd's own line about the unit reaches the journal a little later
    wait_for(lambda: "Watchdog timeout" in sh("journalctl", "-u", "forq@a", "--no-pager").stdout,
             timeout=30, interval=1, message="systemd's watchdog line in the journal")
    job = done(jid, timeout=240)
    assert job.state == "succeeded" and len(claims(job)) == 2, job.history


@in_vm
def test_a_bad_config_fails_the_unit_once_with_one_clear_line():
    Path("/etc/forq/c.toml").write_text('[supervisor]\nlease_tll = "1s"\n')
    assert sh("systemctl", "start", "forq@c", check=False).returncode != 0
    assert show("forq@c", "ActiveState") == "failed"
    assert show("forq@c", "ExecMainStatus") == "2"
    lines = wait_for(lambda: [ln for ln in journal("forq@c").splitlines()
                              if ln.startswith("forq:")], timeout=30, interval=1,
                     message="the unit's one line in the journal")
    assert len(lines) == 1 and "/etc/forq/c.toml" in lines[0] and "lease_tll" in lines[0], lines
    with pytest.raises(AssertionError):  # RestartSec=5s passes: no restart
        wait_for(lambda: show("forq@c", "NRestarts") != "0", timeout=8, interval=1)


def boot_systemd() -> tuple[int, str]:
    """The tests above, run under systemd in the VM: (exit code, console)."""
    if IN_VM:
        pytest.skip("already in the VM")
    from tests import systemd_vm, vm

    pytest_argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x",
                   "-rfEs", "-o", "timeout=600", str(Path(__file__)), "-k", "not real_systemd"]
    # on a failure the units' journals, then the tests' own output last: the assertion
    # shows the console's end, and a long journal must not push the failure out of it
    command = ["sh", "-c", f"{shlex.join(pytest_argv)} > /tmp/vm-tests.out 2>&1; rc=$?; "
               "[ $rc = 0 ] || journalctl -u 'forq@*' -o short-monotonic --no-pager | "
               "tail -n 60; tail -n 120 /tmp/vm-tests.out; exit $rc"]
    try:
        return systemd_vm.run(command, timeout=1100)
    except vm.VMUnavailable as exc:
        pytest.skip(f"no VM here: {exc}")


@pytest.mark.background(boot_systemd, lane="vm")
@pytest.mark.timeout(1200)
def test_the_units_under_a_real_systemd():
    """Boots the VM with systemd as PID 1 and runs the tests above in it, beside the rest
    of the suite (tests/background.py)."""
    rc, console = background.result(boot_systemd, lane="vm")
    assert rc == 0, console[-12000:]
    summary = re.search(r"(\d+) passed", console)
    assert summary and int(summary.group(1)) == 8, console[-12000:]
