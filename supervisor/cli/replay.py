"""forq replay: run a finished job again on this machine, to see why it ended so.

The job's child is started as a supervisor would start it with this config — the same
handler modules, sandbox (`run_as`, environment, namespaces, network, /tmp, open files,
processes) and limits (time, memory: the RSS of its process tree, and the address-space
backstop) — but alone, exec'd fresh (no fork server), with its output on this terminal
and nothing written to Redis: the job's record is only read. Its durable steps recorded
by earlier runs are handed to it, as to any re-run; a step it takes now is answered
"recorded" without being written. Per-job cgroups are not used: memory is policed by
sampling, as without them.

`--pdb` keeps the terminal as the child's stdin and stops in the debugger
(`pdb.post_mortem`) at the handler's exception.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import sys
import time
from typing import Any

from forq import Job, JobNotFound, find_job
from forq.channel import answer
from forq.store.policy import fill, flatten
from forq.store.transitions import Lease
from forq.supervisor.children.launch import Launcher
from forq.supervisor.children.outcomes import Kind, classify
from forq.supervisor.children.running import RunningChild
from forq.supervisor.cli.base import Parents, UsageError, config_of, emit, queue_named, redis_for
from forq.supervisor.fork.child import ChildSpec
from forq.supervisor.fork.messages import channel
from forq.supervisor.isolation.limits import LimitPolice

SAMPLE_EVERY = 0.05  # seconds between two memory samples and time-limit checks
SPEC_FD = 4  # the spec's memfd in the child; fd 0 stays the terminal for --pdb


def replay_spec(job: Job, config: Any, *, post_mortem: bool
                ) -> tuple[ChildSpec, Lease, float]:
    """The child spec a supervisor with `config` would give `job`, the lease it runs
    under (a token nobody holds) and its time limit (s). Limits the record lacks (a job
    never claimed) come from the config's policy."""
    queue = job.queue
    fields = fill(dict(job.fields), flatten(json.dumps(config.job_policy(queue))))
    lease = Lease(dataclasses.replace(job, fields=fields), "replay")
    launcher = Launcher(config)
    # what the fork server's probe would decide; a child that cannot have them says so
    launcher.namespaces_ok = launcher.wants_namespaces() is not None
    spec = launcher.spec(queue, lease)
    spec.imports = list(config.imports)
    spec.post_mortem = post_mortem
    return spec, lease, Launcher.timeout(lease)


def start(spec: ChildSpec, lease: Lease, config: Any) -> RunningChild:
    """Exec the job's child alone (`fork.oneshot`), stdio on this terminal."""
    launch = Launcher.fork_server_launch(config)
    read_fd, write_fd = channel()
    memfd = os.memfd_create("forq-spec", 0)
    try:
        os.write(memfd, json.dumps({"spec": vars(spec), "title": f"forq: replay {spec.job_id}",
                                    "parent": os.getpid()}).encode())
        os.lseek(memfd, 0, os.SEEK_SET)
        env = dict(launch.env, FORQ_FORKSERVER=launch.settings(), FORQ_SPEC_FD=str(SPEC_FD))
        pid = os.posix_spawn(
            sys.executable, [sys.executable, "-m", "forq.supervisor.fork.oneshot"], env,
            file_actions=[(os.POSIX_SPAWN_DUP2, memfd, SPEC_FD),
                          (os.POSIX_SPAWN_DUP2, write_fd, 3)])
    finally:
        os.close(write_fd)
        os.close(memfd)
    os.set_blocking(read_fd, False)
    now = time.monotonic()
    return RunningChild(lease, spec, pid, os.pidfd_open(pid), read_fd, now, now)


def watch(child: RunningChild, timeout: float) -> int:
    """Police the child's limits and answer its steps until it exits; its wait status."""
    child.deadline = child.started + timeout
    police = LimitPolice(lambda _child: None)  # the grace is checked here, below
    while True:
        ready = select.select([child.pipe, child.pidfd] if child.pipe >= 0 else [child.pidfd],
                              [], [], SAMPLE_EVERY)[0]
        if child.pipe in ready and not child.read_pipe():
            os.close(child.pipe)
            child.pipe = -1
        for step in child.reader.steps:  # answered at once, never written to Redis
            print(f"forq: step {step.name!r} taken (not recorded: a replay)", file=sys.stderr)
            child.reader.answered()
            if child.pipe >= 0:
                os.write(child.pipe, answer(step.name, True))
        child.reader.steps.clear()
        if child.pidfd in ready:
            _, status = os.waitpid(child.pid, 0)
            while child.pipe >= 0 and child.read_pipe():  # what it wrote last
                pass
            return status
        police.tick([child])
        if child.kill_reason is not None and child.sigkill_at is not None \
                and time.monotonic() >= child.sigkill_at:
            child.stop(child.kill_reason, grace=0)  # its grace after SIGTERM is over


def cmd_replay(args: argparse.Namespace) -> int:
    if not args.config:
        raise UsageError("forq replay needs --config: the handler modules, sandbox and "
                         "limits to run the job with")
    config = config_of(args)
    client = redis_for(args)
    try:
        job = (queue_named(args.queue, client).get(args.id) if args.queue
               else find_job(client, args.id))
    except JobNotFound as exc:
        raise UsageError(str(exc)) from None
    spec, lease, timeout = replay_spec(job, config, post_mortem=args.pdb)
    print(f"forq: replaying job {job.id} {job.task} (was {job.state}) with {args.config}: "
          f"time limit {timeout:g}s, memory limit "
          f"{spec.memory_limit // (1 << 20) if spec.memory_limit else 'none'} MiB; "
          "nothing is written to Redis", file=sys.stderr)
    child = start(spec, lease, config)
    status = watch(child, timeout)
    outcome = classify(child, status)
    report: dict[str, Any] = {"job": job.id, "task": job.task, "outcome": outcome.metric,
                              "peak_rss": child.peak_rss}
    if outcome.kind is Kind.ACK:
        report["result"] = json.loads(outcome.result_json)
    else:
        report["reason"] = outcome.reason or outcome.error.get("reason", "")
        report["error"] = outcome.error
    if args.json:
        emit(report)
    else:
        if outcome.error.get("traceback"):
            print(outcome.error["traceback"], end="", file=sys.stderr)
        detail = (f"result {outcome.result_json}" if outcome.kind is Kind.ACK
                  else report["reason"])
        peak = f"peak RSS {child.peak_rss / (1 << 20):.1f} MiB"
        print(f"forq: replay of {job.id}: {outcome.metric}: {detail}"
              + ("" if "peak" in detail else f" ({peak})"))
    return 0 if outcome.kind is Kind.ACK else 1


def register(sub: Any, parents: Parents) -> None:
    p = sub.add_parser(
        "replay", parents=[parents.inspect, parents.with_config],
        help="run a finished job again here, its output on the terminal, nothing recorded")
    p.add_argument("id")
    p.add_argument("-q", "--queue", help="the job's queue (default: search every queue)")
    p.add_argument("--pdb", action="store_true",
                   help="stop in the debugger at the handler's exception")
    p.set_defaults(func=cmd_replay)
