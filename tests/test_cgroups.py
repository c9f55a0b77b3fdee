"""Per-job cgroups (cgroup v2): the kernel enforces a job's memory limit, an OOM kill in
the job's cgroup is told from a crash, and every process of a job ends with it.

Our machines are cgroup v1/hybrid hosts, so the tests that need cgroup v2 run inside a
small VM (tests/vm.py: Debian's kernel under qemu, the host's files read-only):
`test_per_job_cgroups_in_a_cgroup_v2_vm` boots it and runs this file there, where each
test starts a real supervisor in a cgroup of its own, as systemd's ``Delegate=yes``
would. On the host, those tests skip (the VM ran them); inside the VM they may not.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forq import Queue
from forq.supervisor.children.outcomes import classify
from forq.supervisor.children.running import RunningChild
from forq.supervisor.fork.child import ChildSpec, run_child
from forq.supervisor.isolation import cgroups
from tests import background, vm
from tests.helpers import gone, wait_for, wait_job
from tests.supervisors import TEST_IMPORTS, SupervisorProcess, wait_children, write_config

IN_VM = os.environ.get("FORQ_IN_VM") == "1"
# the VM runs beside the rest of the suite at a low priority (tests/background.py), under
# software emulation: every deadline of the tests it runs is three times the host's
SLOW = 3 if IN_VM else 1
TERMINAL = ("succeeded", "dead", "cancelled")


@pytest.fixture
def base() -> Iterator[str]:
    """A fresh cgroup for one supervisor, as systemd's Delegate=yes would make it."""
    why = vm.cgroup_v2_problem()
    if why:
        if IN_VM:
            pytest.fail(f"the VM should run cgroup v2 with delegation: {why}")
        pytest.skip(f"needs cgroup v2 ({why}); test_per_job_cgroups_in_a_cgroup_v2_vm "
                    "runs these in a VM")
    path = vm.delegated_cgroup("forq-test")
    yield path
    vm.remove_cgroup_tree(path)


def start(tmp_path: Path, redis_url: str, queue: Queue, cgroup: str | None,
          supervisor_extra: str = "", **options: Any) -> SupervisorProcess:
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2},
                          supervisor_extra=supervisor_extra, **options)
    return SupervisorProcess(config, cgroup=cgroup)


def job_cgroups(base: str) -> list[str]:
    return sorted(name for name in os.listdir(base) if name.startswith("job-"))


def wait_done(queue: Queue, job_id: str, sup: SupervisorProcess, timeout: float = 60):
    return wait_job(queue, job_id, TERMINAL, timeout=timeout * SLOW,
                    context=sup.log)


# -- in a cgroup v2 VM -----------------------------------------------------------------------


@pytest.mark.timeout(120 * SLOW)
def test_each_job_runs_in_its_own_cgroup_with_its_memory_limit(tmp_path, redis_url, queue,
                                                               base):
    with start(tmp_path, redis_url, queue, base) as sup:
        assert f"memory limits by per-job cgroups under {base}" in sup.log()
        # the supervisor, its fork server and the fork server's idle spares live in the
        # leaf, jobs beside it (a spare joins its job's cgroup when it gets one)
        leaf_pids = set(Path(f"{base}/supervisor/cgroup.procs").read_text().split())
        titles = sorted(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                        for pid in leaf_pids - {str(sup.pid)})
        assert str(sup.pid) in leaf_pids and titles[0] == b"forq: fork server", titles
        assert set(titles[1:]) <= {b"forq: fork server: spare"}, titles
        assert "memory" in Path(f"{base}/cgroup.subtree_control").read_text().split()

        jid = queue.enqueue("tests.cgroup", memory_limit="96MiB").id
        job = wait_done(queue, jid, sup)
        assert job.state == "succeeded", job.history
        assert re.fullmatch(rf"{re.escape(base)}/job-{jid}\.\d+", job.result["cgroup"])
        assert job.result["memory_max"] == str(96 << 20)

        unlimited = queue.enqueue("tests.cgroup", memory_limit=0).id
        job = wait_done(queue, unlimited, sup)
        assert job.result["memory_max"] == "max"
        # a job's cgroup goes with it
        wait_for(lambda: not job_cgroups(base), timeout=10 * SLOW, message="job cgroups removed")


@pytest.mark.timeout(120 * SLOW)
def test_a_jobs_cpu_time_is_its_cgroups(tmp_path, redis_url, queue, base):
    """A job's cost: its CPU time read from its cgroup's cpu.stat (every process it held),
    its peak from memory.peak."""
    imports = (*TEST_IMPORTS, "tests.cost_tasks")
    with start(tmp_path, redis_url, queue, base, imports=imports, memory_limit="512MiB") as sup:
        job = wait_done(queue, queue.enqueue("cost.burn", 0.3, 64, 0.3).id, sup)
    assert job.state == "succeeded", job.history
    cost = job.cost
    assert cost is not None, job.fields
    cpu = (cost["cpu_user_ms"] + cost["cpu_system_ms"]) / 1000
    # 0.6 s burnt, and what else ran in the cgroup: the grandchild interpreter's start-up,
    # seconds in the VM (emulated); no more than its two CPUs for the job's wall time
    assert 0.58 <= cpu <= 2 * cost["wall_ms"] / 1000 + 0.5, cost
    assert 64 << 20 <= cost["peak_memory"] <= 512 << 20, cost


@pytest.mark.timeout(120 * SLOW)
@pytest.mark.parametrize("in_grandchild", [False, True], ids=["child", "grandchild"])
def test_the_kernel_enforces_the_memory_limit_and_it_is_not_a_crash(
        tmp_path, redis_url, queue, base, in_grandchild):
    # no address-space backstop: the kernel's limit, not RLIMIT_AS, must stop it
    with start(tmp_path, redis_url, queue, base,
               supervisor_extra="address_space_factor = 0") as sup:
        jid = queue.enqueue("examples.hog", kwargs={"megabytes": 400, "step": 8,
                                                    "in_grandchild": in_grandchild},
                            memory_limit="64MiB", max_attempts=1).id
        job = wait_done(queue, jid, sup, timeout=90)
        assert job.state == "dead", job.history
        assert job.attempts == 1 and job.crashes == 0, job.history
        match = re.match(r"memory limit exceeded \(peak ([0-9.]+) MiB, limit 64 MiB; "
                             r"OOM-killed in its cgroup\)", job.reason)
        assert match, (job.reason, sup.log()[-3000:])
        assert 56 <= float(match.group(1)) <= 64.5, job.reason  # memory.peak: at the limit
        assert job.error["type"] == "MemoryLimit"
        assert [e["event"] for e in job.history] == ["enqueued", "claimed", "dead"]
        # RSS sampling did not do it
        assert "over its limit" not in sup.log()
        wait_for(lambda: not job_cgroups(base), timeout=10 * SLOW, message="job cgroups removed")


@pytest.mark.timeout(120 * SLOW)
def test_an_oom_kill_outside_the_job_limit_is_a_crash(tmp_path, redis_url, queue, base):
    """The job is within its own limit, but the whole service is not (systemd's
    MemoryMax= on the unit): the kernel's OOM killer takes the job (its oom_score_adj
    says so), which is not the job's fault. A crash (reclaimed), said as such."""
    with start(tmp_path, redis_url, queue, base,
               supervisor_extra="address_space_factor = 0") as sup:
        used = int(Path(f"{base}/memory.current").read_text())
        Path(f"{base}/memory.max").write_text(str(used + (96 << 20)))
        jid = queue.enqueue("examples.hog", kwargs={"megabytes": 400, "step": 8},
                            memory_limit="256MiB", max_crashes=1).id
        job = wait_done(queue, jid, sup, timeout=90)
        assert job.state == "dead", job.history
        assert job.crashes == 1 and job.attempts == 0, job.history
        assert job.reason.startswith("OOM-killed outside its own limit: the machine or an "
                                     "enclosing cgroup ran out of memory (killed by SIGKILL, "
                                     "peak RSS "), job.reason
        assert sup.proc.poll() is None  # the kernel chose the job, not the supervisor


@pytest.mark.timeout(120 * SLOW)
def test_a_process_that_left_the_job_process_group_ends_with_the_job(tmp_path, redis_url,
                                                                     queue, base):
    with start(tmp_path, redis_url, queue, base) as sup:
        jid = queue.enqueue("tests.escape").id
        job = wait_done(queue, jid, sup)
        assert job.state == "succeeded", job.history
        wait_for(lambda: gone(job.result), timeout=10 * SLOW,
                 message=f"the escaped process {job.result} killed")
        wait_for(lambda: not job_cgroups(base), timeout=10 * SLOW, message="job cgroups removed")


@pytest.mark.timeout(120 * SLOW)
def test_a_crash_in_a_job_cgroup_is_still_a_crash(tmp_path, redis_url, queue, base):
    with start(tmp_path, redis_url, queue, base, lease_ttl="30s") as sup:
        jid = queue.enqueue("examples.sleep", 60, max_crashes=1).id
        (pid,) = wait_children(sup.pid, 1, timeout=30 * SLOW)
        os.kill(pid, signal.SIGKILL)
        job = wait_done(queue, jid, sup)
        assert job.state == "dead" and job.crashes == 1, job.history
        assert job.reason.startswith("killed by SIGKILL"), job.reason
        assert "OOM" not in job.reason


@pytest.mark.timeout(120 * SLOW)
def test_a_new_supervisor_sweeps_the_cgroups_of_one_killed(tmp_path, redis_url, queue, base):
    sup = start(tmp_path, redis_url, queue, base).start()
    try:
        queue.enqueue("examples.sleep", 60)
        wait_children(sup.pid, 1, timeout=30 * SLOW)
        (stale,) = job_cgroups(base)
    finally:
        sup.kill()
    wait_for(lambda: not Path(f"{base}/supervisor/cgroup.procs").read_text().strip(),
             timeout=10 * SLOW, message="the killed supervisor's processes gone")
    assert job_cgroups(base) == [stale]  # empty, and left behind
    # restarted where it was (its leaf): the stale job cgroup is removed at start
    with start(tmp_path, redis_url, queue, f"{base}/supervisor") as again:
        assert f"per-job cgroups under {base}" in again.log()
        assert stale not in job_cgroups(base)


@pytest.mark.timeout(120 * SLOW)
def test_when_job_cgroups_cannot_be_made_rss_sampling_takes_over(tmp_path, redis_url, queue,
                                                                 base):
    with start(tmp_path, redis_url, queue, base) as sup:
        Path(f"{base}/cgroup.max.descendants").write_text("1")  # just the leaf
        jid = queue.enqueue("examples.hog", kwargs={"megabytes": 200, "step": 4},
                            memory_limit="64MiB", max_attempts=1).id
        job = wait_done(queue, jid, sup, timeout=90)
        assert job.state == "dead", job.history
        assert job.reason.startswith("memory limit exceeded (peak "), job.reason
        assert "cgroup" not in job.reason  # RSS sampling caught it
        assert "cannot create its cgroup" in sup.log()
        assert "memory limits by RSS sampling from now on" in sup.log()
        ok = queue.enqueue("examples.add", 1, 2).id
        assert wait_done(queue, ok, sup).state == "succeeded"
        assert not job_cgroups(base)


# -- anywhere --------------------------------------------------------------------------------


@pytest.mark.timeout(60 * SLOW)
def test_required_job_cgroups_refuse_to_start_without_them(tmp_path, redis_url, queue):
    """Run where per-job cgroups cannot be used (a v1/hybrid host; in the VM, the root
    cgroup): "auto" falls back and says why, "required" refuses to start."""
    with start(tmp_path, redis_url, queue, None) as sup:
        assert re.search(r"memory limits by RSS sampling \((cgroup v1/hybrid host|the "
                         r"supervisor runs in the root cgroup)", sup.log()), sup.log()
    sup = start(tmp_path, redis_url, queue, None, supervisor_extra='job_cgroups = "required"')
    sup.start(wait_ready=False)
    assert sup.wait(timeout=30 * SLOW) == 1
    assert "per-job cgroups unavailable: " in sup.log()
    assert '[supervisor].job_cgroups = "required"' in sup.log()
    assert "Traceback" not in sup.log()


def test_a_child_that_cannot_join_its_cgroup_hands_its_job_back(tmp_path):
    """Real fork, real exit: the child exits before running the handler, and the parent
    releases the job (no attempt, no crash counted) instead of calling it a crash."""
    spec = ChildSpec(job_id="j1", queue="q", task="tests.echo", args=[], kwargs={},
                     attempts=0, crashes=0, memory_limit=0, max_result_bytes=1024,
                     cgroup=str(tmp_path / "no-such-cgroup"))
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        run_child(spec, write_fd, os.getppid(), "forq: test child")
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == cgroups.JOIN_FAILED
    assert os.read(read_fd, 100) == b""  # no report: the handler never ran
    os.close(read_fd)
    child = RunningChild(None, spec, pid, -1, -1, 0.0, 0.0)  # type: ignore[arg-type]
    outcome = classify(child, status)
    assert (outcome.kind, outcome.reason) == ("release", "could not join its job cgroup")


def boot_the_cgroup_v2_vm() -> tuple[int, str]:
    """This file's cgroup v2 tests, run in the VM: (exit code, console)."""
    if IN_VM:
        pytest.skip("already in the VM")
    if not vm.cgroup_v2_problem():
        pytest.skip("this host has cgroup v2 with delegation: the tests above ran here")
    command = [sys.executable, "-m", "tests.redis_server", "--", sys.executable, "-m",
               "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", str(Path(__file__)),
               "-k", "not in_a_cgroup_v2_vm"]
    try:
        return vm.run(command, timeout=840)
    except vm.VMUnavailable as exc:
        pytest.skip(f"no VM here: {exc}")


@pytest.mark.background(boot_the_cgroup_v2_vm, lane="vm")
@pytest.mark.timeout(900)
def test_per_job_cgroups_in_a_cgroup_v2_vm():
    """Boots the VM and runs this file's cgroup v2 tests in it, beside the rest of the
    suite (tests/background.py)."""
    rc, console = background.result(boot_the_cgroup_v2_vm, lane="vm")
    assert rc == 0, console[-8000:]
    summary = re.search(r"(\d+) passed", console)
    assert summary and int(summary.group(1)) >= 9, console[-8000:]
    assert "skipped" not in console and "failed" not in console, console[-8000:]
