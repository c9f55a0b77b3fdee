"""Sending a plan's commands (`forq.store.plans`): the part the sync and async clients share,
and the sync client's runner.

A batch of one transition is sent alone (EVALSHA, reloaded on NOSCRIPT: one round
trip); anything else goes in one non-transactional pipeline. Queueing a command on a
pipeline does no I/O in redis-py's sync and asyncio clients alike, so `queue_commands`
and `regroup` serve both; only `execute` differs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from forq.store import topology
from forq.store.plans import Command, Plan, WaitReplicas
from forq.store.scripts import Scripts
from forq.store.transitions import ScriptCall

T = TypeVar("T")


def alone(commands: Sequence[Command]) -> ScriptCall | None:
    """The transition to send by itself, when the batch is just that."""
    if len(commands) == 1 and isinstance(commands[0], ScriptCall):
        return commands[0]
    return None


def queue_commands(pipe: Any, commands: Sequence[Command],
                   queue_script: Callable[[ScriptCall], Any]) -> list[int]:
    """Queue every command on `pipe`; returns how many replies each will have (a WAIT
    goes to every cluster node that owns one of its keys)."""
    counts = []
    for command in commands:
        if isinstance(command, ScriptCall):
            queue_script(command)
            counts.append(1)
        elif isinstance(command, WaitReplicas):
            counts.append(topology.queue_wait(pipe, command.replicas, command.timeout_ms,
                                              command.keys))
        else:
            pipe.execute_command(*command)
            counts.append(1)
    return counts


def regroup(replies: Sequence[Any], commands: Sequence[Command], counts: list[int]) -> list[Any]:
    """One reply per command: a `WaitReplicas` gets the list of its WAIT replies."""
    out, at = [], 0
    for command, n in zip(commands, counts, strict=True):
        out.append(list(replies[at:at + n]) if isinstance(command, WaitReplicas) else replies[at])
        at += n
    return out


def send(client: Any, scripts: Scripts, commands: Sequence[Command]) -> list[Any]:
    """One round trip for a batch; raises the first error a command got."""
    call = alone(commands)
    if call is not None:
        return [scripts.run(call)]
    pipe = client.pipeline(transaction=False)
    counts = queue_commands(pipe, commands, lambda c: scripts.run(c, pipe))
    return regroup(pipe.execute(), commands, counts)


def run_plan(client: Any, scripts: Scripts, plan: Plan[T]) -> T:
    """Drive a plan to its result, one round trip per batch it yields."""
    try:
        commands = next(plan)
        while True:
            commands = plan.send(send(client, scripts, commands))
    except StopIteration as done:
        result: T = done.value
        return result
