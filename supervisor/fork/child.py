"""What runs in the forked child: isolate, limit, run one handler, report, `_exit`.

Everything here executes after `fork()` in a copy of the fork server
(supervisor/fork/server.py), or of the supervisor itself when it runs without one. It
must never return into the parent's loop, never touch the parent's sockets, and never
write metrics: it reports once, through its result pipe, then `_exit`s.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from forq import registry
from forq.channel import Channel, LeaseLost, StepError
from forq.supervisor.fork import namespaces, orphans, sandbox
from forq.supervisor.fork.messages import ERROR_CAPS, encode
from forq.supervisor.isolation.cgroups import JOIN_FAILED

PR_SET_PDEATHSIG = 1

_RESET_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD,
                  signal.SIGPIPE, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                  orphans.DEATH_SIGNAL)


@dataclass
class ChildSpec:
    """Everything the child needs, computed by the parent before fork."""

    job_id: str
    queue: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    attempts: int
    crashes: int
    memory_limit: int
    max_result_bytes: int
    nice: int = 10
    address_space_factor: float = 4.0
    oom_score_adj: int = 800
    run_as: str | None = None
    env_allow: list[str] | None = None
    max_open_files: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    cgroup: str = ""  # the job's own cgroup v2 directory, joined first (supervisor/isolation/cgroups.py)
    traceparent: str = ""  # the handler span's, when the supervisor traces (supervisor/observe/tracing.py)
    # handler modules the child imports itself, after its sandbox: only for a child
    # exec'd alone (`oneshot`); a fork server's children have them preloaded
    imports: list[str] = field(default_factory=list)
    max_output_bytes: int = 1 << 20  # stdout + stderr logged, the rest dropped and counted
    # [sandbox].namespaces: PID, mount and IPC namespaces of its own (`namespaces`)
    namespaces: bool = False
    network: str = "host"  # "none": a network namespace with only loopback
    private_tmp: bool = False  # a tmpfs of its own on /tmp and /dev/shm
    tmp_bytes: int = 64 << 20
    max_processes: int = 0  # RLIMIT_NPROC in its own user namespace (0: not set)
    # the job's durable steps recorded by earlier runs: name -> result JSON (`forq.channel`)
    steps: dict[str, str] = field(default_factory=dict)
    # `forq replay --pdb`: stdin kept (the terminal), the debugger at the handler's exception
    post_mortem: bool = False
    group: str | None = None  # the job's group (`current().throttle(group=True)`)
    snoozes: int = 0  # how often its handler put it off (`Retry`, `throttle`)
    # [[queue]].max_throttle in ms: the parent caps a handler's throttle at this
    max_throttle_ms: int = 0
    # a chunk (`task(chunk=N)`): every job of it, this one first, each {"id", "args",
    # "kwargs", "attempts", "crashes", "snoozes"}; [] for a child of one job
    chunk: list[dict[str, Any]] = field(default_factory=list)


def _find_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


PRCTL = _find_prctl()  # resolved once in the supervisor, not in every child


def die_with_parent(parent_pid: int, parent_pidfd: int = -1) -> None:
    """Ask the kernel for SIGKILL when the parent dies (the fork server, which dies with
    the supervisor; or the supervisor), then re-check: if the parent died between fork
    and prctl, nobody else will kill us. By its pidfd when it gave us one (readable
    once it exited): PID 1 of a namespace of its own has no parent pid to compare."""
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    ppid = os.getppid()  # 0 for PID 1 of a namespace: then only the pidfd can tell
    if ppid:
        if ppid != parent_pid:
            os._exit(70)
    elif parent_pidfd < 0 or select.select([parent_pidfd], [], [], 0)[0]:
        os._exit(70)


def _join_cgroup(path: str) -> None:
    """Enter the job's cgroup before any handler code runs, so the job's memory is
    charged to (and limited by) it. A child that cannot exits at once with JOIN_FAILED:
    the supervisor hands the job back and stops using per-job cgroups."""
    try:
        with open(f"{path}/cgroup.procs", "w") as f:
            f.write("0")
    except OSError:
        os._exit(JOIN_FAILED)


def detach(keep_stdin: bool = False) -> None:
    """The part of `_isolate` that needs no job: a session of its own, a child subreaper
    (the orphans of its descendants stay in its tree: `orphans`), default signals, stdin
    from /dev/null. A spare does it while it waits (`spares.wait_for_job`), so that
    these calls, and the copy-on-write faults of their first touches, are off a job's
    pick-up path."""
    os.setsid()
    orphans.become_subreaper(PRCTL)
    signal.set_wakeup_fd(-1)
    for sig in _RESET_SIGNALS:
        # every one, even where Python's table says SIG_DFL: an extension module may
        # have set a handler in the fork server without it knowing
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    if keep_stdin:
        return
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def _isolate(spec: ChildSpec, result_fd: int, output_fd: int = -1,
             detached: bool = False) -> int:
    """Detach from the supervisor's signals, fds and session. Returns the new pipe fd.
    stdout and stderr become `output_fd` (a pipe the supervisor reads), never the
    supervisor's own log."""
    if not detached:
        detach(keep_stdin=spec.post_mortem)
    # keep only stdio and the result pipe (moved to fd 3): a handler never holds the
    # supervisor's Redis connection, metrics socket or another child's pipe
    if output_fd >= 0:
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
    if result_fd != 3:
        os.dup2(result_fd, 3, inheritable=False)
    os.closerange(4, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    return 3


# (nice, oom_score_adj) a spare set while it waited (`preset_priority`)
Priority = tuple[int, int]


DEFAULT_PRIORITY: Priority = (ChildSpec.nice, ChildSpec.oom_score_adj)  # the field defaults


def priority_of(spec: ChildSpec) -> Priority:
    return spec.nice, spec.oom_score_adj


def _limit(spec: ChildSpec, preset: Priority | None = None) -> None:
    if preset is None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if spec.address_space_factor > 0 and spec.memory_limit > 0:
        # a backstop only: virtual size overstates real use, so the real limit is the
        # parent's RSS sampling; this catches a runaway allocation between samples
        cap = int(spec.memory_limit * spec.address_space_factor)
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or cap < hard:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    if spec.max_open_files:
        resource.setrlimit(resource.RLIMIT_NOFILE, (spec.max_open_files, spec.max_open_files))
    if preset is None:
        sandbox.set_oom_score_adj(spec.oom_score_adj)
        if spec.nice:
            os.nice(spec.nice)
    elif preset != priority_of(spec):  # not handed such a job (`Spares.fits`)
        raise ValueError(f"a spare preset to {preset} got a job of {priority_of(spec)}")


def _sandbox(spec: ChildSpec) -> None:
    if spec.env_allow is not None:
        for name in [k for k in os.environ if k not in spec.env_allow]:
            del os.environ[name]
    if spec.extra_env:
        os.environ.update(spec.extra_env)
    if spec.run_as:  # already done by the fork server; here for a child exec'd alone
        sandbox.drop_to(spec.run_as)


def _error(exc: BaseException) -> dict[str, Any]:
    """The report of a handler's exception, capped as the parent will check it: a
    10 MB message is still an error of the handler, not a result too large."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 — a hostile __str__ must not lose the report
        message = "<unprintable exception>"
    name = type(exc).__name__
    return {
        "type": name[:ERROR_CAPS["type"]],
        "message": message[:ERROR_CAPS["message"]],
        "traceback": tb[-ERROR_CAPS["traceback"]:],
        "reason": f"{name}: {message}"[:ERROR_CAPS["reason"]],
    }


def _plain_error(exc: BaseException, kind: str) -> dict[str, Any]:
    """The error part of a handler's own retry or throttle: what it said, no traceback
    (it is not a failure)."""
    try:
        message = str(exc)[:ERROR_CAPS["reason"]]
    except Exception:  # noqa: BLE001 — a hostile __str__ must not lose the report
        message = kind
    return {"type": kind, "message": message, "traceback": "", "reason": message}


def encode_report(spec: ChildSpec, run: Any, fd: int = -1) -> bytes:
    """Run the handler and encode the one result message the parent reads
    (`forq.supervisor.fork.messages` is the schema); `fd` is the channel the handler's
    progress and steps go through first. b"" when a step found the lease lost: this run
    must say nothing more (the parent drops it)."""
    channel = Channel(fd, spec.steps)
    ctx = registry.JobContext(spec.job_id, spec.queue, spec.task, spec.attempts, spec.crashes,
                              group=spec.group, snoozes=spec.snoozes,
                              traceparent=spec.traceparent, channel=channel)
    registry.set_current(ctx)
    task = registry.lookup(spec.task)
    try:
        if task is None:
            raise LookupError(f"unknown task {spec.task!r}")
        result = run(task, spec.args, spec.kwargs)
    except LeaseLost:
        return b""
    except BaseException as exc:  # noqa: BLE001 — every failure is reported, none escapes
        if spec.post_mortem and not isinstance(exc, (registry.Retry, registry.Throttled)):
            import pdb

            pdb.post_mortem(exc.__traceback__)
        channel.flush()
        return encode(failure(exc, fatal=task is None))
    channel.flush()  # the last progress, before the result (nothing may follow that)
    result_json, problem = result_of(result, spec.max_result_bytes)
    if problem is not None:
        return encode(problem)
    opened = ""
    if ctx.opened is not None:
        opened = ',"batch":' + json.dumps(ctx.opened, separators=(",", ":"))
    return ('{"t":"result","ok":true,"result":' + result_json + ',"followups":'
            + json.dumps(ctx.followups, separators=(",", ":")) + opened + "}\n").encode()


def failure(exc: BaseException, fatal: bool = False) -> dict[str, Any]:
    """The result message of a handler that raised `exc`: its own `Retry` or throttle,
    or a failure (no retry for `NonRetryable`, a step's error, or `fatal`)."""
    if isinstance(exc, registry.Retry):
        return {"t": "result", "ok": False, "error": _plain_error(exc, "Retry"),
                "retry": {"delay_ms": exc.delay_ms, "counted": exc.counted}}
    if isinstance(exc, registry.Throttled):
        return {"t": "result", "ok": False, "error": _plain_error(exc, "Throttled"),
                "throttle": {"delay_ms": exc.delay_ms, "group": exc.group}}
    fatal = fatal or isinstance(exc, (registry.NonRetryable, StepError))
    return {"t": "result", "ok": False, "error": _error(exc), "fatal": fatal}


def result_of(result: Any, max_bytes: int) -> tuple[str, dict[str, Any] | None]:
    """(the result as JSON, None), or ("", the fatal failure message) for a result that
    is not JSON or over `max_bytes`."""
    try:
        result_json = json.dumps(result, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        err = _error(exc)
        err["reason"] = f"result is not JSON-serialisable: {exc}"[:ERROR_CAPS["reason"]]
        return "", {"t": "result", "ok": False, "error": err, "fatal": True}
    if len(result_json) > max_bytes:
        err = {"type": "ResultTooLarge", "message": "", "traceback": "",
               "reason": f"result too large: {len(result_json)} bytes over the "
                         f"{max_bytes}-byte max_result_bytes"}
        return "", {"t": "result", "ok": False, "error": err, "fatal": True}
    return result_json, None


def run_chunk(spec: ChildSpec, fd: int) -> None:
    """A chunk's handler (`task(chunk=N)`), called with a `ChunkJob` per job: each
    job's result message (with its "job" id) is written when it is reported, so a later
    crash leaves it settled. The rest is settled by the handler's return (None: each
    succeeded; a list: one outcome per job, an exception a failure) or its raise."""

    def report(job: registry.ChunkJob, result: Any, exc: BaseException | None) -> None:
        if exc is None:
            result_json, message = result_of(result, spec.max_result_bytes)
            if message is None:
                _write_all(fd, b'{"t":"result","job":%s,"ok":true,"result":%s}\n' % (
                    json.dumps(job.id).encode(), result_json.encode()))
                return
        else:
            message = failure(exc, fatal=task is None)
        _write_all(fd, encode({**message, "job": job.id}))

    registry.set_current(None)  # `current()` is one job's: a chunk has none
    task = registry.lookup(spec.task)
    jobs = [registry.ChunkJob(m["id"], spec.queue, spec.task, m["args"], m["kwargs"], m["attempts"],
                              m["crashes"], report, m.get("snoozes", 0)) for m in spec.chunk]
    try:
        if task is None:
            raise LookupError(f"unknown task {spec.task!r}")
        returned = task.call_chunk(jobs)
        if returned is not None and (not isinstance(returned, list)
                                     or len(returned) != len(jobs)):
            raise TypeError(f"chunked task {spec.task!r} returned {type(returned).__name__}"
                            f"; it returns None or a list of {len(jobs)} outcomes")
    except BaseException as exc:  # noqa: BLE001 — every job left is failed with it
        for job in jobs:
            if not job.reported:
                job.fail(exc)
        return
    for i, job in enumerate(jobs):
        if not job.reported:
            outcome = None if returned is None else returned[i]
            if isinstance(outcome, BaseException):
                job.fail(outcome)
            else:
                job.ok(outcome)


def _import(modules: list[str]) -> bytes:
    """Import the handler modules (a child exec'd alone); a failure is the job's fatal
    error, reported like any other."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 — handler code, reported
            err = _error(exc)
            err["reason"] = f"cannot import handler module {name}: {err['reason']}"[
                :ERROR_CAPS["reason"]]
            return encode({"t": "result", "ok": False, "error": err, "fatal": True})
    return b""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _call(task: registry.TaskSpec, args: list[Any], kwargs: dict[str, Any]) -> Any:
    return task.call(args, kwargs)


def run_child(spec: ChildSpec, result_fd: int, parent_pid: int, title: str,
              output_fd: int = -1, parent_pidfd: int = -1,
              preset: Priority | None = None) -> None:
    """The child's whole life (`preset`: a spare's, that ran `detach` and
    `preset_priority` already). Never returns."""
    code = 0
    try:
        if preset is None:  # a spare asked, and checked, before it waited
            die_with_parent(parent_pid, parent_pidfd)
        # its own process group and default signals first: joining a cgroup can wait for
        # an RCU grace period, and a SIGTERM meanwhile must reach it, not be ignored
        fd = _isolate(spec, result_fd, output_fd, detached=preset is not None)
        if spec.cgroup:
            _join_cgroup(spec.cgroup)
        try:
            import setproctitle

            setproctitle.setproctitle(title)
        except Exception:  # noqa: BLE001 — a missing title must not fail the job
            pass
        if spec.namespaces:
            problem = namespaces.enter_for_job(spec.network == "none", spec.private_tmp,
                                               spec.tmp_bytes, spec.max_processes)
            if problem:
                _write_all(fd, problem)
                os._exit(0)
        elif namespaces.holds_namespace_capabilities():
            namespaces.drop_capabilities()  # those of its fork server's user namespace
        _sandbox(spec)
        _limit(spec, preset)
        report = _import(spec.imports)
        if not report and spec.chunk:
            _write_all(fd, b'{"t":"began","at":%.6f}\n' % time.monotonic())
            run_chunk(spec, fd)
        elif not report:
            began = time.monotonic()  # the handler's first line: its start latency ends
            report = encode_report(spec, _call, fd)
            if report:  # every result is one JSON object: "began" goes in front
                report = b'{"began":%.6f,' % began + report[1:]
        _write_all(fd, report)
    except BaseException:  # noqa: BLE001
        code = 71  # the parent sees an exit without a report: a crash, reclaimed
    finally:
        os._exit(code)
