"""Hostile handlers: a job's child is untrusted, and nothing it does may harm the
supervisor or another job (the threat table in docs/sandbox.md).

Each test runs a real supervisor and handlers written to do harm (tests/hostile.py)."""

from __future__ import annotations

import base64
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from forq import Queue
from forq.supervisor.children.reader import MessageReader
from forq.supervisor.fork.messages import encode
from forq.supervisor.leases.calls import leasing
from forq.testing.redis import RedisServer
from forq.testing.system_python import Unavailable, venv_python
from tests.helpers import wait_for, wait_job
from tests.supervisors import (
    REPO,
    TEST_IMPORTS,
    SupervisorProcess,
    fork_servers_of,
    write_config,
)

pytestmark = pytest.mark.timeout(120)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def sup(tmp_path, redis_url, queue):
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 4})
    proc = SupervisorProcess(config).start()
    yield proc
    proc.stop()


def assert_serving(sup, queue) -> None:
    """The supervisor is alive and still runs an ordinary job to success."""
    assert sup.proc.poll() is None, sup.log()
    job = queue.enqueue("tests.echo", "still here")
    assert job.wait(timeout=20) == {"args": ["still here"], "kwargs": {}}
    assert "Traceback" not in sup.log(), sup.log()
    assert "unexpected error" not in sup.log(), sup.log()


MALFORMED = [
    # well-formed JSON of an unexpected shape: each once killed the supervisor
    b'{"ok": false, "error": "boom"}\n',
    b'{"t": "result", "ok": false, "error": "boom"}\n',
    b'{"t": "result", "ok": true, "followups": [1]}\n',
    b'{"t": "result", "ok": true, "followups": [{"task": "x"}]}\n',
    b'{"t": "result", "ok": true, "followups": {"a": 1}}\n',
    b'{"t": "result", "ok": "yes"}\n',
    b'{"t": "result", "ok": false, "error": {"type": 1}}\n',
    b'{"t": "result", "ok": true, "result": NaN}\n',
    b'{"t": "result", "ok": true, "result": 1}\n{"t": "result", "ok": true}\n',
    b'{"t": "progress", "value": 1}\n',
    # progress and steps (`forq.channel`): out of range, wrong types, over their caps
    b'{"t": "progress", "progress": 1.5}\n',
    b'{"t": "progress", "progress": NaN}\n',
    b'{"t": "progress", "progress": -Infinity}\n',
    b'{"t": "progress", "progress": 1' + b"0" * 400 + b'}\n',
    b'{"t": "progress", "progress": true}\n',
    b'{"t": "progress", "progress": 0.5, "message": 7}\n',
    b'{"t": "progress", "progress": 0.5, "message": "' + b"m" * 600 + b'"}\n',
    b'{"t": "progress", "progress": 0.5}\n' * 5000,  # a flood
    b'{"t": "step", "name": "a"}\n',
    b'{"t": "step", "name": "", "result": 1}\n',
    b'{"t": "step", "name": ["a"], "result": 1}\n',
    b'{"t": "step", "name": "' + b"n" * 201 + b'", "result": 1}\n',
    b'{"t": "step", "name": "a", "result": "' + b"r" * (64 * 1024) + b'"}\n',
    b'{"t": "step", "name": "a", "result": NaN}\n',
    b'{"t": "step", "name": "a", "result": 1, "extra": 2}\n',
    # a second step before the first was answered; a step flood
    b'{"t": "step", "name": "a", "result": 1}\n{"t": "step", "name": "b", "result": 1}\n',
    b''.join(b'{"t": "step", "name": "s%d", "result": 1}\n' % i for i in range(2000)),
    # a request for parents' results (`forq.channel`): a second before the answer, a
    # field the parent does not take (which parents is Redis's to say)
    b'{"t": "parents"}\n{"t": "parents"}\n',
    b'{"t": "parents", "job": "another"}\n',
    # a handler's own retry and throttle: out of range, another queue named, both at once
    b'{"t": "result", "ok": false, "error": {}, "retry": {"delay_ms": -5}}\n',
    b'{"t": "result", "ok": false, "error": {}, "retry": {"delay_ms": 1e300}}\n',
    b'{"t": "result", "ok": false, "error": {}, "throttle": {"delay_ms": 5, "queue": "x"}}\n',
    b'{"t": "result", "ok": false, "error": {}, "throttle": {"delay_ms": 5, "group": true}}\n',
    b'{"t": "result", "ok": false, "error": {}, "throttle": {"delay_ms": 5}, '
    b'"retry": {"delay_ms": 5}}\n',
    b'[1, 2, 3]\n',
    b'"just a string"\n',
    b'\xff\xfe\x00garbage\n',
    b'{"t": "result", "ok": true, "result": ' + b"[" * 100000 + b"\n",
    b'{"t": "result", "ok": true',  # cut short: no end of line, then EOF
]


@pytest.mark.parametrize("data", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_message_is_a_crash_of_that_job_never_of_the_supervisor(sup, queue, data):
    job = queue.enqueue("hostile.pipe", b64(data), max_crashes=1)
    done = wait_job(queue, job.id, ("dead",), context=sup.log)
    assert "sent a malformed message" in done.history[-1].get("reason", "") or any(
        "sent a malformed message" in e.get("reason", "") for e in done.history), done.history
    assert_serving(sup, queue)


def test_a_follow_up_that_names_another_jobs_id_is_refused(sup, queue):
    """Follow-up ids derive from the parent's: a child cannot overwrite another job."""
    victim = queue.enqueue("tests.echo", "victim", delay="1h")
    spec = {"id": victim.id, "task": "tests.echo", "args": "[]", "kwargs": "{}",
            "queue": queue.name, "parent": "whatever", "priority": 0}
    message = {"t": "result", "ok": True, "result": None, "followups": [spec]}
    job = queue.enqueue("hostile.pipe", b64(encode(message)), max_crashes=1)
    done = wait_job(queue, job.id, ("dead",), context=sup.log)
    assert any("followups[0]: id must be" in e.get("reason", "") for e in done.history)
    assert queue.get(victim.id).args == ["victim"]
    assert_serving(sup, queue)


def test_a_well_formed_message_written_by_hand_is_a_result(sup, queue):
    message = {"t": "result", "ok": True, "result": {"by": "hand"}, "followups": []}
    job = queue.enqueue("hostile.pipe", b64(encode(message)))
    assert job.wait(timeout=20) == {"by": "hand"}


def test_an_endless_line_is_a_result_too_large_and_the_child_is_stopped(sup, queue):
    job = queue.enqueue("hostile.flood_pipe", 64 << 20, max_result_bytes="64KiB")
    done = wait_job(queue, job.id, ("dead",), context=sup.log)
    assert "result too large" in done.history[-1].get("reason", ""), done.history
    assert_serving(sup, queue)


def test_an_exception_with_a_10_mb_message_is_a_retried_error(sup, queue):
    """Not "result too large": the child caps an error's fields before sending them."""
    job = queue.enqueue("hostile.huge_error", 10 << 20, max_attempts=2)
    done = wait_job(queue, job.id, ("dead",), context=sup.log)
    assert done.attempts == 2, done.history
    assert done.error["type"] == "ValueError"
    assert len(done.error["message"]) == 64 * 1024
    assert_serving(sup, queue)


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rng.randint(-2**70, 2**70)
    if kind == 1:
        return rng.choice([True, False, None, 1.5, -0.0])
    if kind == 2:
        return "".join(rng.choice("ab{}\"\\\n\u00e9t") for _ in range(rng.randrange(12)))
    if kind == 3:
        return rng.choice(["t", "ok", "result", "followups", "error", "fatal", "id"])
    if kind == 4:
        return {"t": "result", "ok": rng.choice([True, False, 1, "x"])}
    if kind == 5:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["t", "ok", "result", "followups", "error", "fatal", "type", "message",
            "reason", "traceback", "id", "task", "args", "kwargs", "queue", "parent"]
    return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def _hostile_payloads(rng: random.Random, n: int) -> list[bytes]:
    valid = encode({"t": "result", "ok": True, "result": [1, "two"], "followups": []})
    out = []
    for _ in range(n):
        kind = rng.randrange(4)
        if kind == 0:
            out.append(rng.randbytes(rng.randrange(1, 300)))
        elif kind == 1:
            out.append(json.dumps(_random_json(rng)).encode() + b"\n")
        elif kind == 2:  # a valid message, mutated
            data = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            out.append(bytes(data))
        else:  # a valid message cut short, or followed by more
            out.append(valid[:rng.randrange(len(valid))] if rng.random() < 0.5
                       else valid + rng.randbytes(rng.randrange(1, 40)))
    return out


def test_the_message_reader_survives_a_fuzzer():
    """In process, fast: 20,000 hostile streams, fed in random chunks. Each ends as a
    checked report, a violation or an overflow — never an exception."""
    rng = random.Random(20261201)
    outcomes = {"report": 0, "violation": 0, "overflow": 0, "nothing": 0}
    for data in _hostile_payloads(rng, 20000):
        reader = MessageReader("j1", line_cap=200)
        view = memoryview(data)
        while view:
            cut = rng.randrange(1, len(view) + 1)
            reader.feed(bytes(view[:cut]))
            view = view[cut:]
        reader.finish()
        if reader.violation:
            outcomes["violation"] += 1
        elif reader.overflow:
            outcomes["overflow"] += 1
        elif reader.report is not None:
            outcomes["report"] += 1
            json.loads(reader.report.result_json)  # re-encoded here: valid JSON
        else:
            outcomes["nothing"] += 1
    assert outcomes["violation"] > 10000 and outcomes["report"] > 100, outcomes


@pytest.mark.timeout(240)
def test_a_supervisor_survives_a_thousand_jobs_writing_garbage(tmp_path, redis_url, queue):
    """Real children, real pipes: 1,000 jobs write random bytes and random JSON shapes;
    the supervisor keeps serving and every job is accounted for."""
    # most of them end "malformed": the circuit breaker would rightly trip the task
    # (tests/test_breaker.py); here every one must run
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 4},
                          defaults="breaker = { failures = 0 }")
    sup = SupervisorProcess(config).start()
    try:
        payloads = _hostile_payloads(random.Random(4242), 1000)
        jobs = queue.enqueue_many([{"task": "hostile.pipe", "args": [b64(p)], "max_crashes": 1, "max_attempts": 1}
                                   for p in payloads])
        ids = [j.id for j in jobs]

        def settled():
            stats = queue.stats()
            return stats["pending"] == 0 and stats["active"] == 0 and stats["scheduled"] == 0

        wait_for(settled, timeout=200, interval=0.2, message="all hostile jobs to end")
        states = [queue.get(i).state for i in ids]
        assert set(states) <= {"succeeded", "dead"}, set(states)
        assert states.count("dead") > 500
        assert_serving(sup, queue)
    finally:
        sup.stop()


# -- the supervisor never runs handler code; no secret reaches a job ------------------

PASSWORD = "s3cret-redis-pw"


@pytest.fixture(scope="module")
def system_python() -> str:
    """A venv that `nobody` can run (this machine's own Python may be under /root)."""
    try:
        return str(venv_python(REPO))
    except Unavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def locked_redis():
    """A Redis that wants a password; the supervisor gets it from FORQ_REDIS_PASSWORD."""
    with RedisServer(requirepass=PASSWORD) as server:
        yield server


@pytest.fixture
def shared_dir():
    """A directory every user may write to (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="forq-hostile-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_locked(tmp_path, locked_redis, shared_dir, *, command=None, extra=""):
    """A supervisor on the password-protected Redis, importing tests.hostile_import
    (whose top-level code logs where it runs to shared_dir/imports)."""
    url = f"redis://127.0.0.1:{locked_redis.port}/0"
    config = write_config(tmp_path / "forq.toml", url, {"locked": 2},
                          imports=(*TEST_IMPORTS, "tests.hostile_import"), extra=extra)
    env = {"FORQ_REDIS_PASSWORD": PASSWORD, "FORQ_TEST_IMPORT_LOG": str(shared_dir / "imports")}
    return SupervisorProcess(config, env=env, command=command).start()


def assert_no_secret_reachable(sup, locked_redis):
    queue = Queue("locked", url=locked_redis.url)
    imports = [json.loads(line) for line in (Path(sup.env["FORQ_TEST_IMPORT_LOG"])
                                             .read_text().splitlines())]
    # module top-level code ran once, in the fork server, which never had the password
    assert [i["pid"] for i in imports] == fork_servers_of(sup.pid), (imports, sup.log())
    assert not any(i["password"] for i in imports), imports
    # what it printed is logged as the fork server's; the log was not truncated
    wait_for(lambda: "output: hostile_import loaded" in sup.log(), timeout=10,
             message="the module's print in the log")
    for server in fork_servers_of(sup.pid):  # so it cannot truncate the log: a pipe
        assert [os.readlink(f"/proc/{server}/fd/{fd}")[:5] for fd in (1, 2)] == ["pipe:"] * 2
    seen = queue.enqueue("hostile.find_secrets", PASSWORD).wait(timeout=20)
    assert not any(seen.values()), seen
    assert queue.enqueue("hostile.reach_redis", locked_redis.port).wait(timeout=20) is False
    return imports


def test_handler_modules_run_only_in_the_fork_server_which_has_no_password(
        tmp_path, locked_redis, shared_dir):
    sup = run_locked(tmp_path, locked_redis, shared_dir)
    try:
        assert_no_secret_reachable(sup, locked_redis)
    finally:
        sup.stop()
    assert "Traceback" not in sup.log(), sup.log()


@pytest.mark.skipif(os.geteuid() != 0, reason="run_as needs root")
def test_with_run_as_handler_modules_are_imported_as_that_user(
        tmp_path, locked_redis, shared_dir, system_python):
    sup = run_locked(tmp_path, locked_redis, shared_dir,
                     command=[system_python, "-m", "forq.supervisor.cli"],
                     extra='[sandbox]\nrun_as = "nobody"\n')
    try:
        imports = assert_no_secret_reachable(sup, locked_redis)
        assert [i["uid"] for i in imports] == [pwd.getpwnam("nobody").pw_uid]
    finally:
        sup.stop()
    assert "Traceback" not in sup.log(), sup.log()


# -- a job's processes end with the job, and all count ------------------------------

NAMESPACES = "[sandbox]\nnamespaces = true\n"


def processes_named(marker: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.info["cmdline"] and proc.info["cmdline"][0] == marker:
            found.append(proc.pid)
    return found


@pytest.fixture
def marker(queue):
    """A name for the processes a test's job leaves behind; any still there are killed."""
    name = f"forq-escapee-{queue.name}"
    yield name
    for pid in processes_named(name):
        os.kill(pid, signal.SIGKILL)


def forq_cli(*args: str, redis_url: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", *args, "--redis",
                           redis_url], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def start_sup(tmp_path, redis_url, queue, extra="", concurrency=2, **options):
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: concurrency},
                          extra=extra, **options)
    return SupervisorProcess(config).start()


# Where a job's processes are kept: a PID namespace of its own; or neither namespaces
# nor a per-job cgroup, as in a container without privileges (subreapers: fork/orphans.py)
SANDBOXES = {"namespaces": {"extra": NAMESPACES},
             "bare": {"extra": "[sandbox]\n", "supervisor_extra": 'job_cgroups = "off"'}}


@pytest.fixture(params=sorted(SANDBOXES))
def sandbox(request) -> dict[str, str]:
    """start_sup's options for each way a job's processes are kept (`SANDBOXES`)."""
    return dict(SANDBOXES[request.param])


def with_sandbox(sandbox: dict[str, str], more: str) -> dict[str, str]:
    return {**sandbox, "extra": sandbox["extra"] + more}


def assert_bare_line(sup) -> None:
    """The start-up line of a bare sandbox says how escapees are handled instead."""
    line = next(ln for ln in sup.log().splitlines() if "sandbox: on:" in ln)
    assert "every process of a job ends with it" in line, line


@pytest.mark.parametrize("then", ["return", "hang", "crash", "cancel"])
def test_an_escapee_dies_with_its_job(tmp_path, redis_url, queue, marker, then, sandbox):
    """Double fork + setsid leaves a process outside the job's process group: it still
    dies when the job succeeds, is killed at its time limit, crashes or is cancelled."""
    sup = start_sup(tmp_path, redis_url, queue, **sandbox)
    try:
        job = queue.enqueue("hostile.escape", marker, "hang" if then == "cancel" else then,
                            timeout="30s" if then == "cancel" else "1s", max_attempts=1,
                            max_crashes=1)
        if then == "cancel":
            wait_for(lambda: processes_named(marker), timeout=20, message="the escapee")
            queue.cancel(job.id)
        ended = {"return": "succeeded", "cancel": "cancelled"}.get(then, "dead")
        done = wait_job(queue, job.id, (ended,), context=sup.log)
        assert done.state == ended, done.history
        wait_for(lambda: not processes_named(marker), timeout=5, message="the escapee gone")
    finally:
        sup.stop()


def test_an_escapee_dies_when_its_job_kills_its_fork_server(tmp_path, redis_url, queue,
                                                            marker):
    """The fork server SIGKILLed (here by the job itself, as a `run_as` job may: same
    user) cannot end what its jobs left: that comes to the supervisor, which does."""
    sup = start_sup(tmp_path, redis_url, queue, **SANDBOXES["bare"])
    try:
        servers = fork_servers_of(sup.pid)
        job = queue.enqueue("hostile.escape", marker, "kill its fork server", max_crashes=1)
        wait_job(queue, job.id, ("dead",), context=sup.log)
        assert f"fork server {servers[0]} lost" in sup.log(), sup.log()
        wait_for(lambda: not processes_named(marker), timeout=5, message="the escapee gone")
        assert_serving(sup, queue)
    finally:
        sup.stop()


@pytest.mark.parametrize("then", ["return", "hang"])
def test_without_a_fork_server_an_escapee_dies_with_its_job(tmp_path, redis_url, queue,
                                                           marker, then):
    """Each child exec'd alone (`fork_server = false`): what it leaves is the
    supervisor's, which ends it (not when the supervisor is SIGKILLed: the line says)."""
    sup = start_sup(tmp_path, redis_url, queue, supervisor_extra="fork_server = false")
    try:
        assert "job_processes ([supervisor].fork_server = false" in sup.log(), sup.log()
        job = queue.enqueue("hostile.escape", marker, then, timeout="3s", max_attempts=1)
        done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
        assert done.state == ("succeeded" if then == "return" else "dead"), done.history
        wait_for(lambda: not processes_named(marker), timeout=5, message="the escapee gone")
    finally:
        sup.stop()


def test_an_escapee_dies_with_its_supervisor(tmp_path, redis_url, queue, marker, sandbox):
    """SIGKILL of the supervisor: the fork server ends every job's processes before it
    goes (its death signal is caught), or its PID namespace's end does."""
    sup = start_sup(tmp_path, redis_url, queue, **sandbox)
    try:
        queue.enqueue("hostile.escape", marker, "hang")
        wait_for(lambda: processes_named(marker), timeout=20, message="the escapee")
        sup.kill()
        wait_for(lambda: not processes_named(marker), timeout=5, message="the escapee gone")
    finally:
        sup.stop()


def test_an_escapees_memory_counts_against_its_job(tmp_path, redis_url, queue, marker,
                                                    sandbox):
    """300 MiB held by a setsid grandchild under a 100 MiB limit (RSS sampling)."""
    sup = start_sup(tmp_path, redis_url, queue, memory_limit="100MiB", **sandbox)
    try:
        job = queue.enqueue("hostile.hog_outside", 300, marker, max_attempts=1)
        done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
        assert done.state == "dead" and "memory limit exceeded" in done.reason, done.history
        assert_serving(sup, queue)
    finally:
        sup.stop()


@pytest.mark.parametrize("where,escape", [("memfd", False), ("shm", True)])
def test_shared_memory_a_job_holds_counts_against_it(tmp_path, redis_url, queue, where,
                                                     escape, sandbox):
    """300 MiB written to a memfd, or to a file in /dev/shm held by a setsid grandchild,
    never mapped (in no RSS), under a 100 MiB limit."""
    sup = start_sup(tmp_path, redis_url, queue, memory_limit="100MiB", **sandbox)
    try:
        job = queue.enqueue("hostile.hog_shared", 300, where, escape, max_attempts=1)
        done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
        assert done.state == "dead" and "memory limit exceeded" in done.reason, done.history
        assert_serving(sup, queue)
    finally:
        sup.stop()


def test_a_job_whose_shared_memory_cannot_be_counted_is_stopped(tmp_path, redis_url, queue):
    """More open files than the sampler looks through (4,096): its memory-backed files
    could hide there, so the job is stopped, not trusted."""
    sup = start_sup(tmp_path, redis_url, queue, memory_limit="100MiB", **SANDBOXES["bare"])
    try:
        job = queue.enqueue("hostile.many_files", 5000, max_attempts=1)
        done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
        assert done.state == "dead" and "memory not measurable" in done.reason, done.history
        assert "hold over 4096 open files" in done.reason, done.reason
        assert_serving(sup, queue)
    finally:
        sup.stop()


@pytest.mark.parametrize("how", ["subreaper", "clone_parent"])
def test_a_process_that_leaves_its_jobs_tree_is_killed_while_the_job_runs(
        tmp_path, redis_url, queue, marker, how):
    """Handler code clears its child's subreaper flag and double-forks, or makes a
    sibling of its child (CLONE_PARENT): the process is the fork server's, outside the
    tree whose memory is sampled, and it kills it within its scan (50 ms)."""
    if how == "clone_parent" and os.uname().machine != "x86_64":
        pytest.skip("the raw clone call is x86_64's")
    sup = start_sup(tmp_path, redis_url, queue, **SANDBOXES["bare"])
    try:
        seen = queue.enqueue("hostile.leave_tree", marker, how).wait(timeout=20)
        assert seen["lived"] is not None and seen["lived"] < 1.0, seen
        assert not processes_named(marker)
        assert_serving(sup, queue)
    finally:
        sup.stop()


def test_a_fork_bomb_is_stopped_at_max_processes(tmp_path, redis_url, queue, sandbox):
    """As root no RLIMIT_NPROC holds: the sampler counts the job's processes."""
    sup = start_sup(tmp_path, redis_url, queue, memory_limit="1GiB",
                    **with_sandbox(sandbox, "max_processes = 20\n"))
    try:
        job = queue.enqueue("hostile.fork_bomb", 200, max_attempts=1)
        done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
        assert done.state == "dead" and "too many processes" in done.reason, done.history
        assert_serving(sup, queue)
    finally:
        sup.stop()


# -- jobs cannot see or signal each other or the supervisor ---------------------------

def prowl_beside_a_victim(sup, queue):
    victim = queue.enqueue("tests.lineage", 3)
    wait_for(lambda: queue.get(victim.id).state == "active", timeout=20, message="victim")
    found = queue.enqueue("hostile.prowl", sup.pid).wait(timeout=20)
    assert victim.wait(timeout=20)["pid"], queue.get(victim.id).history  # unharmed
    assert sup.proc.poll() is None
    return found


def test_without_namespaces_a_root_job_finds_and_kills_another(tmp_path, redis_url, queue):
    """The attack, shown: what namespaces take away (the victim is counted a crash)."""
    sup = start_sup(tmp_path, redis_url, queue)
    try:
        victim = queue.enqueue("tests.lineage", 5, max_crashes=1)
        wait_for(lambda: queue.get(victim.id).state == "active", timeout=20, message="victim")
        found = queue.enqueue("hostile.prowl", sup.pid).wait(timeout=20)
        assert found["killed"] and found["supervisor"]["pidfd"], found
        assert wait_job(queue, victim.id, ("dead",)).crashes == 1
    finally:
        sup.stop()


def test_with_namespaces_a_job_sees_no_other_process(tmp_path, redis_url, queue):
    sup = start_sup(tmp_path, redis_url, queue, NAMESPACES)
    try:
        found = prowl_beside_a_victim(sup, queue)
        assert found == {"jobs": [], "killed": [], "supervisor": {
            "in /proc": False, "signal": False, "pidfd": False, "environ": False,
            "mem": False}}, found
    finally:
        sup.stop()
    assert "Traceback" not in sup.log(), sup.log()


def processes_of_job(job_id: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.info["cmdline"] and proc.info["cmdline"][0].startswith(f"forq: job {job_id} "):
            found.append(proc)
    return found


def assert_one_process_pid_1_of_its_own(queue, job_id: str) -> None:
    """The job's child is PID 1 of its namespaces itself: one process per job (not a
    child that waits for PID 1), whose last pid in NSpid is 1."""
    wait_for(lambda: processes_of_job(job_id), timeout=20, message="the job's process")
    [proc] = processes_of_job(job_id)
    with open(f"/proc/{proc.pid}/status") as f:
        nspid = next(line.split()[1:] for line in f if line.startswith("NSpid:"))
    assert nspid[0] == str(proc.pid) and nspid[-1] == "1" and len(nspid) >= 2, nspid


def test_a_namespaced_job_is_one_process_pid_1_of_its_own(tmp_path, redis_url, queue):
    sup = start_sup(tmp_path, redis_url, queue, NAMESPACES)
    try:
        job = queue.enqueue("hostile.whoami", 3)
        assert_one_process_pid_1_of_its_own(queue, job.id)
        seen = job.wait(timeout=20)
        assert seen["pid"] == 1 and seen["sees"] == [1], seen
    finally:
        sup.stop()
    assert "Traceback" not in sup.log(), sup.log()


# -- network and /tmp ------------------------------------------------------------------

@pytest.mark.parametrize("per", ["queue", "task"])
def test_network_none_leaves_loopback_only(tmp_path, redis_url, queue, per):
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    if per == "queue":
        sup = start_sup(tmp_path, redis_url, queue, queue_extra='network = "none"\n')
    else:
        sup = start_sup(tmp_path, redis_url, queue,
                        '[sandbox.tasks."hostile.dial"]\nnetwork = "none"\n')
    try:
        seen = queue.enqueue("hostile.dial", port).wait(timeout=20)
        assert seen == {"outside": False, "loopback": True, "interfaces": ["lo"]}, seen
        if per == "task":  # other tasks keep the network
            assert queue.enqueue("hostile.reach_redis", port).wait(timeout=20) is True
    finally:
        sup.stop()


def test_private_tmp_is_the_jobs_own_and_capped(tmp_path, redis_url, queue, marker):
    sup = start_sup(tmp_path, redis_url, queue,
                    '[sandbox]\nprivate_tmp = true\ntmp_size = "8MiB"\n')
    try:
        said = queue.enqueue("hostile.fill_tmp", marker, 32 << 20).wait(timeout=20)
        assert said == "refused: No space left on device", said
        assert not os.path.exists(f"/tmp/{marker}")
    finally:
        sup.stop()


# -- output: captured, capped, attributed ----------------------------------------------

def test_output_is_logged_with_the_job_id_and_its_tail_kept(tmp_path, redis_url, queue):
    sup = start_sup(tmp_path, redis_url, queue)
    try:
        job = queue.enqueue("hostile.shout", 3)
        assert job.wait(timeout=20) == "shouted"
        log = sup.log()
        for i in range(3):  # escaped: a job cannot colour, or forge, a log line
            assert f"job {job.id} output: line {i} \\x1b[31mred\\x1b[0m" in log, log
        assert f"job {job.id} output: the end" in log
        output = queue.get(job.id).output
        assert output.startswith("line 0 \x1b[31mred") and output.endswith("the end\n"), output
        shown = forq_cli("job", job.id, redis_url=redis_url)
        assert "output" in shown and "line 2" in shown, shown
    finally:
        sup.stop()


def test_an_output_flood_is_capped_and_counted(tmp_path, redis_url, queue):
    """200 MB to stdout grows the supervisor's log by at most max_output_bytes."""
    sup = start_sup(tmp_path, redis_url, queue, '[sandbox]\nmax_output_bytes = "64KiB"\n')
    try:
        before = sup.log_path.stat().st_size
        job = queue.enqueue("hostile.shout", 1, 200 << 20)
        assert job.wait(timeout=60) == "shouted"
        wait_for(lambda: "dropped over max_output_bytes" in sup.log(), timeout=10,
                 message="the count of dropped bytes")
        assert sup.log_path.stat().st_size - before < 256 << 10
        assert queue.get(job.id).output.endswith("the end\n")
        assert_serving(sup, queue)
    finally:
        sup.stop()


def test_truncating_stdout_leaves_the_supervisors_log_alone(tmp_path, redis_url, queue):
    sup = start_sup(tmp_path, redis_url, queue)
    try:
        size = sup.log_path.stat().st_size
        job = queue.enqueue("hostile.shout", 1, 0, True)
        assert job.wait(timeout=20) == "shouted"
        assert sup.log_path.stat().st_size >= size
        assert "ftruncate refused: Invalid argument" in queue.get(job.id).output
    finally:
        sup.stop()


# -- the start-up line; [sandbox].require ---------------------------------------------

def test_the_start_up_line_names_what_is_on_and_off(tmp_path, redis_url, queue):
    sup = start_sup(tmp_path, redis_url, queue, NAMESPACES + 'network = "none"\n')
    try:
        line = next(ln for ln in sup.log().splitlines() if "sandbox: on:" in ln)
        assert "a PID, mount and IPC namespace per job" in line, line
        assert f"no network but loopback for queue {queue.name}" in line, line
        assert "off: run_as (jobs run as the supervisor's user (root)" in line, line
    finally:
        sup.stop()


def test_require_refuses_to_start_without_a_protection(tmp_path, redis_url, queue):
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1},
                          extra='[sandbox]\nrequire = ["run_as", "namespaces"]\n')
    proc = subprocess.run([sys.executable, "-m", "forq.supervisor.cli", "run", "--config",
                           str(config)], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "FORQ_REDIS_URL"})
    assert proc.returncode == 2, proc.stderr
    assert "refusing to start: [sandbox].require" in proc.stderr
    assert "names run_as, which is off" in proc.stderr and "names namespaces" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="run_as needs root")
def test_the_full_sandbox_as_an_unprivileged_user(tmp_path, redis_url, queue, system_python,
                                                   marker):
    """run_as, and every namespace in a user namespace of the job's own: the kernel
    holds max_processes (RLIMIT_NPROC counts that namespace alone), no job sees another,
    escapees die with their job, no network, a private /tmp."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    # RSS sampling counts the pages 20 forks share 20 times: room for that
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2},
                          memory_limit="1GiB", extra="""
[sandbox]
run_as = "nobody"
namespaces = true
network = "none"
private_tmp = true
max_processes = 20
require = ["run_as", "namespaces", "network", "private_tmp", "max_processes"]
""")
    sup = SupervisorProcess(config, command=[system_python, "-m", "forq.supervisor.cli"]).start()
    try:
        assert "RLIMIT_NPROC in the job's user namespace" in sup.log(), sup.log()
        started = queue.enqueue("hostile.fork_bomb", 200).wait(timeout=30)
        assert 10 < started < 20, started
        found = prowl_beside_a_victim(sup, queue)
        assert not found["jobs"] and not any(found["supervisor"].values()), found
        assert queue.enqueue("hostile.escape", marker).wait(timeout=20)
        wait_for(lambda: not processes_named(marker), timeout=5, message="the escapee gone")
        seen = queue.enqueue("hostile.dial", port).wait(timeout=20)
        assert not seen["outside"] and seen["loopback"], seen
        assert "wrote it all" == queue.enqueue("hostile.fill_tmp", marker, 1 << 20).wait()
        assert not os.path.exists(f"/tmp/{marker}")
        # the fork server made a user and PID namespace of its own to fork each job as
        # PID 1 of its own; the job keeps no capability of either
        job = queue.enqueue("hostile.whoami", 3)
        assert_one_process_pid_1_of_its_own(queue, job.id)
        seen = job.wait(timeout=20)
        assert seen["cap_eff"] == seen["cap_bnd"] == "0000000000000000", seen
    finally:
        sup.stop()
    assert "Traceback" not in sup.log(), sup.log()


def test_under_run_as_a_job_without_namespaces_holds_no_capability(
        tmp_path, redis_url, queue, system_python):
    """One task without network gives the fork server a user namespace of its own
    (where it holds every capability, to make each such job's namespaces): the other
    tasks' jobs, forked plainly from it, must hold none of them."""
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2}, extra="""
[sandbox]
run_as = "nobody"
[sandbox.tasks."hostile.dial"]
network = "none"
""")
    sup = SupervisorProcess(config, command=[system_python, "-m", "forq.supervisor.cli"]).start()
    try:
        seen = queue.enqueue("hostile.whoami").wait(timeout=20)
        assert seen["pid"] != 1 and seen["cap_eff"] == "0000000000000000", seen
        assert seen["cap_bnd"] == "0000000000000000", seen
        port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
        dialled = queue.enqueue("hostile.dial", port).wait(timeout=20)
        assert not dialled["outside"] and dialled["loopback"], dialled
        # a job of it exits with its own status and its fork server reports its end
        # by the name it knows it by: many in a row, on two slots
        jobs = [queue.enqueue("hostile.whoami") for _ in range(20)]
        assert all(j.wait(timeout=30)["cap_eff"] == "0000000000000000" for j in jobs)
        # its pid is of the fork server's PID namespace: /proc is that namespace's too
        assert queue.enqueue("hostile.proc_self").wait(timeout=20) is True
        assert not queue.enqueue("hostile.prowl", sup.pid).wait(timeout=20)["supervisor"][
            "in /proc"]
    finally:
        sup.stop()
    assert "Traceback" not in sup.log(), sup.log()


@pytest.mark.skipif(os.geteuid() != 0, reason="run_as needs root")
def test_without_namespaces_or_cgroups_a_run_as_jobs_processes_all_end_and_count(
        tmp_path, redis_url, queue, system_python, marker):
    """As in a container without privileges: no namespaces, no per-job cgroups, jobs as
    `nobody`. Escapees die with their job and with their SIGKILLed supervisor; their
    memory, memfds and /dev/shm files count; a fork bomb is stopped; a process taken out
    of the job's tree is killed while the job runs."""
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 2},
                          memory_limit="100MiB", supervisor_extra='job_cgroups = "off"',
                          extra='[sandbox]\nrun_as = "nobody"\nmax_processes = 20\n'
                                'require = ["run_as", "job_processes", "shared_memory"]\n')
    sup = SupervisorProcess(config, command=[system_python, "-m", "forq.supervisor.cli"]).start()
    try:
        assert_bare_line(sup)
        assert queue.enqueue("hostile.escape", marker).wait(timeout=20)
        wait_for(lambda: not processes_named(marker), timeout=5, message="the escapee gone")
        for task, args in (("hostile.hog_outside", (300, marker)),
                           ("hostile.hog_shared", (300, "memfd")),
                           ("hostile.hog_shared", (300, "shm", True))):
            job = queue.enqueue(task, *args, max_attempts=1)
            done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
            assert done.state == "dead" and "memory limit exceeded" in done.reason, (
                task, args, done.history)
        job = queue.enqueue("hostile.fork_bomb", 200, max_attempts=1, memory_limit="1GiB")
        done = wait_job(queue, job.id, ("succeeded", "dead"), context=sup.log)
        assert done.state == "dead" and "too many processes" in done.reason, done.history
        seen = queue.enqueue("hostile.leave_tree", marker).wait(timeout=20)
        assert seen["lived"] is not None and seen["lived"] < 1.0, seen
        # another job is the same user's (it can signal it); the supervisor is not
        victim = queue.enqueue("tests.lineage", 5, max_crashes=1)
        wait_for(lambda: queue.get(victim.id).state == "active", timeout=20, message="victim")
        found = queue.enqueue("hostile.prowl", sup.pid).wait(timeout=20)
        assert found["killed"], found
        assert not any(found["supervisor"][k] for k in ("signal", "environ", "mem")), found
        assert wait_job(queue, victim.id, ("dead",)).crashes == 1
        queue.enqueue("hostile.escape", marker, "hang")
        wait_for(lambda: processes_named(marker), timeout=20, message="the escapee")
        assert pwd.getpwuid(psutil.Process(processes_named(marker)[0]).uids().real).pw_name \
            == "nobody"
        sup.kill()
        wait_for(lambda: not processes_named(marker), timeout=5, message="the escapee gone")
    finally:
        sup.stop()
    assert "Traceback" not in sup.log(), sup.log()


@pytest.mark.skipif(os.geteuid() != 0, reason="run_as needs root")
@pytest.mark.parametrize("namespaces", ["every job", "one task"])
def test_under_run_as_a_world_readable_config_and_password_file_are_empty_for_jobs(
        shared_dir, locked_redis, system_python, namespaces):
    """The fork server's own mount namespace (made where jobs get namespaces) has
    /dev/null over both: a job reads nothing there, with namespaces of its own or not."""
    secret = shared_dir / "redis.password"
    secret.write_text(PASSWORD)
    sandbox = ("namespaces = true\n" if namespaces == "every job"
               else '[sandbox.tasks."hostile.dial"]\nnetwork = "none"\n')
    config = write_config(shared_dir / "forq.toml", f"redis://127.0.0.1:{locked_redis.port}/0",
                          {"locked": 1}, extra=f'[sandbox]\nrun_as = "nobody"\n'
                          f'require = ["private_config"]\n{sandbox}')
    config.write_text(config.read_text().replace(
        "[redis]\n", f'[redis]\npassword_file = "{secret}"\n'))
    for path in (config, secret):
        path.chmod(0o644)
    sup = SupervisorProcess(config, command=[system_python, "-m", "forq.supervisor.cli"]).start()
    try:
        assert "config and password file empty for nobody" in sup.log(), sup.log()
        queue = Queue("locked", url=locked_redis.url)
        for path in (config, secret):
            assert queue.enqueue("hostile.read_file", str(path)).wait(timeout=20) == {"read": ""}
        assert PASSWORD in secret.read_text()  # unchanged, outside
    finally:
        sup.stop()
    assert "Traceback" not in sup.log(), sup.log()


@pytest.mark.skipif(os.geteuid() != 0, reason="run_as needs root")
def test_without_namespaces_require_refuses_a_config_a_run_as_job_could_read(
        shared_dir, redis_url, system_python):
    config = write_config(shared_dir / "forq.toml", redis_url, {"q": 1},
                          extra='[sandbox]\nrun_as = "nobody"\nrequire = ["private_config"]\n')
    config.chmod(0o644)
    proc = subprocess.run([system_python, "-m", "forq.supervisor.cli", "run", "--config",
                           str(config)], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "FORQ_REDIS_URL"})
    assert proc.returncode == 2, proc.stderr
    assert f"names private_config, which is off: {config} readable by nobody" in proc.stderr


def _docs_acl_recipe() -> list[list[str]]:
    """The ACL commands of docs/sandbox.md, "Not covered", as that page shows them."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "sandbox.md").read_text()
    commands = [line.split() for line in text.splitlines() if line.startswith("ACL SETUSER")]
    assert len(commands) == 2, "docs/sandbox.md: the ACL recipe is two ACL SETUSER lines"
    return commands


def test_the_docs_redis_acl_recipe_serves_a_supervisor(tmp_path):
    """docs/sandbox.md's recipe, run as written: an ACL user for supervisors, the
    default user off; a supervisor serves with it, and a job cannot log in."""
    with RedisServer() as server:
        admin = Queue("acl", url=server.url).redis
        for command in _docs_acl_recipe():
            admin.execute_command(*(word.replace("SUPERVISOR-PASSWORD", "sup-pw")
                                    for word in command))
        url = f"redis://forq-supervisor@127.0.0.1:{server.port}/0"
        config = write_config(tmp_path / "forq.toml", url, {"acl": 1})
        sup = SupervisorProcess(config, env={"FORQ_REDIS_PASSWORD": "sup-pw"}).start()
        try:
            queue = Queue("acl", url=f"redis://forq-supervisor:sup-pw@127.0.0.1:{server.port}/0")
            assert queue.enqueue("tests.echo", 1, delay="200ms").wait(timeout=20)
            assert queue.enqueue("hostile.reach_redis", server.port).wait(timeout=20) is False
        finally:
            sup.stop()
        assert "Traceback" not in sup.log(), sup.log()


def test_output_is_kept_only_while_the_lease_is_held(queue):
    """lua/output.lua is fenced like a transition: a stale supervisor writes nothing."""
    job = queue.enqueue("tests.echo")
    [lease] = leasing(queue).claim("me", 1, 60_000).leases
    assert leasing(queue).set_output(job.id, "stale-token", "forged\n") == "lost"
    assert queue.get(job.id).output == ""
    assert leasing(queue).set_output(job.id, lease.token, "printed\n") == "ok"
    assert queue.get(job.id).output == "printed\n"
