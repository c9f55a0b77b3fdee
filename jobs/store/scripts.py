"""Load the Lua transitions from ``lua/`` and call them by SHA.

The scripts are the only code that changes job state. redis-py's `Script` sends
EVALSHA and reloads the source on NOSCRIPT (after a Redis restart or failover),
inside pipelines too. A ``--@include includes/NAME`` line is replaced by
``lua/includes/NAME.lua``, the way BullMQ's includes are: each script includes the
helper files it calls, each helper file those it calls, and `expand` pastes each file
once, before the first file that needs it (lua/README.md, "Includes").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import redis
from redis.client import Pipeline
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from forq.store.transitions import TRANSITIONS, ScriptCall, Transition

__all__ = ["TRANSITIONS", "ForqRedis", "ScriptPipeline", "Scripts", "expand", "source"]

# a path under lua/ without ".lua": "includes/time" ("_lib" before lua/includes/ existed)
_INCLUDE = re.compile(r"^--@include ([\w/]+)\s*$", re.MULTILINE)


def _lua_dir() -> Path:
    try:
        path = Path(str(resources.files("forq.lua")))
        if (path / "claim.lua").exists():
            return path
    except ModuleNotFoundError:
        pass
    return Path(__file__).resolve().parent.parent.parent / "lua"


def expand(name: str, read: Callable[[str], str]) -> str:
    """`name`'s text (``read(name)``, a path under lua/ without ".lua") with every
    ``--@include`` line replaced by the included file, expanded the same way: a file
    comes in at its first include line in this depth-first walk, so after every file it
    includes itself (a Lua local exists from its definition on), and a later line for it
    is dropped, so it comes once. An include cycle or a missing include is a ValueError
    naming the file that includes it. Older versions' trees expand alike (their `_lib`
    included `_groups`): tests and benchmarks rebuild what those versions loaded."""
    done: set[str] = set()

    def walk(current: str, chain: tuple[str, ...]) -> str:
        if current in chain:
            raise ValueError(f"lua/{chain[-1]}.lua: include cycle "
                             f"{' -> '.join((*chain[chain.index(current):], current))}")
        if not chain:
            text = read(current)  # the script itself: the caller's own error
        else:
            try:
                text = read(current)
            except (OSError, LookupError) as exc:
                raise ValueError(f"lua/{chain[-1]}.lua: --@include {current}: no file "
                                 f"lua/{current}.lua ({exc})") from None

        def paste(m: re.Match[str]) -> str:
            included = m.group(1)
            if included in done:
                return ""
            text = walk(included, (*chain, current))
            done.add(included)
            return text
        return _INCLUDE.sub(paste, text)
    return walk(name, ())


@cache
def source(name: str) -> str:
    """The script's text with its includes expanded (`expand`)."""
    directory = _lua_dir()
    return expand(name, lambda path: (directory / f"{path}.lua").read_text())


class Scripts:
    """The transitions registered on one client: `run` sends a `ScriptCall` (built by
    `forq.store.transitions`) by EVALSHA, reloading the script on NOSCRIPT; on a pipeline it
    queues the call instead. Each script is also an attribute (its `sha`, for tests)."""

    def __init__(self, client: redis.Redis) -> None:
        register = client.register_script
        self.enqueue: Script = register(source("enqueue"))
        self.claim: Script = register(source("claim"))
        self.extend: Script = register(source("extend"))
        self.ack: Script = register(source("ack"))
        self.fail: Script = register(source("fail"))
        self.expire: Script = register(source("expire"))
        self.reclaim: Script = register(source("reclaim"))
        self.release: Script = register(source("release"))
        self.cancel: Script = register(source("cancel"))
        self.requeue_dead: Script = register(source("requeue_dead"))
        self.purge_dead: Script = register(source("purge_dead"))
        self.output: Script = register(source("output"))
        self.pause: Script = register(source("pause"))
        self.resume: Script = register(source("resume"))
        self.sweep_expired: Script = register(source("sweep_expired"))
        self.progress: Script = register(source("progress"))
        self.step: Script = register(source("step"))
        self.batch: Script = register(source("batch"))
        self.batch_relay: Script = register(source("batch_relay"))
        self.promote: Script = register(source("promote"))
        self.reschedule: Script = register(source("reschedule"))
        self.set_priority: Script = register(source("set_priority"))
        self.find: Script = register(source("find"))
        self.schedule_define: Script = register(source("schedule_define"))
        self.schedule_fired: Script = register(source("schedule_fired"))
        self.throttle: Script = register(source("throttle"))
        self.set_throttle: Script = register(source("set_throttle"))
        self.parents: Script = register(source("parents"))
        self.resume_task: Script = register(source("resume_task"))
        self.trim: Script = register(source("trim"))
        self._by_name: dict[Transition, Script] = {name: getattr(self, name)
                                                   for name in TRANSITIONS}

    def script(self, call: ScriptCall) -> Script:
        """The registered script `call` runs (its `sha` and source)."""
        return self._by_name[call.script]

    def run(self, call: ScriptCall, client: Any = None) -> Any:
        """The raw reply; with a pipeline as `client`, the pipeline (the call queued)."""
        return self._by_name[call.script](keys=call.keys, args=call.args, client=client)


class ScriptPipeline(Pipeline):
    """A pipeline that sends forq's scripts by EVALSHA without asking first.

    redis-py's pipeline sends ``SCRIPT EXISTS`` (a whole round trip) before every
    execute that holds a script. This one remembers, per connection pool, which scripts
    it has loaded: the first pipeline to use a script loads it first, later ones just
    send EVALSHA. When Redis lost them (a restart, a failover, SCRIPT FLUSH), a reply is
    NOSCRIPT: the scripts are loaded again and just those commands re-sent. A NOSCRIPT
    command never ran, so re-sending cannot apply anything twice; it does run after the
    rest of its pipeline, which every transition tolerates (each is fenced by token or
    idempotent by job id; a reclaim that ran too early is redone by the next reaper
    pass). WAITs after a re-sent command are re-sent too, so a WAIT still follows every
    write it vouches for.
    """

    def _loaded(self) -> set[str]:
        return loaded_shas(self.connection_pool)

    def load_scripts(self) -> None:
        loaded = self._loaded()
        missing = [script for script in self.scripts if script.sha not in loaded]
        if missing:
            loader = Pipeline(self.connection_pool, self.response_callbacks, False, None)
            for script in missing:
                loader.script_load(script.script)
            loader.execute()
            loaded.update(script.sha for script in missing)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = [(tuple(args), dict(options)) for args, options in self.command_stack]
        scripts = list(self.scripts)
        replies = super().execute(raise_on_error=False)

        def reload(_shas: set[str]) -> None:
            loaded = self._loaded()
            loaded.clear()  # the server forgot them all
            for script in scripts:
                script.registered_client.script_load(script.script)
                loaded.add(script.sha)

        def fresh() -> Pipeline:
            return Pipeline(self.connection_pool, self.response_callbacks, False, None)

        return finish_pipeline(self, stack, replies, reload, fresh, raise_on_error)


def loaded_shas(pool: Any) -> set[str]:
    """The SHAs of the scripts this connection pool has loaded (as far as it knows: a
    NOSCRIPT reply says Redis forgot them)."""
    loaded: set[str] | None = getattr(pool, "_forq_loaded_scripts", None)
    if loaded is None:
        loaded = set()
        setattr(pool, "_forq_loaded_scripts", loaded)  # noqa: B010 (not a pool attribute)
    return loaded


def finish_pipeline(pipe: Any, stack: list[tuple[tuple[Any, ...], dict[str, Any]]],
                    replies: list[Any], reload: Any, fresh: Any,
                    raise_on_error: bool) -> list[Any]:
    """After a pipeline ran with raise_on_error=False: re-send the commands a server
    answered NOSCRIPT once `reload(shas)` loaded the scripts again (and every WAIT after
    the first of them, so a WAIT still follows each write it vouches for), on the
    pipeline `fresh()` gives; then raise the first error if asked to."""
    again = noscript_resends(stack, replies)
    if again:
        reload({stack[i][0][1] for i in again if isinstance(replies[i], NoScriptError)})
        retry = fresh()
        for i in again:
            retry.execute_command(*stack[i][0], **stack[i][1])
        for i, reply in zip(again, retry.execute(raise_on_error=False), strict=True):
            replies[i] = reply
    if raise_on_error:
        raise_first_error(pipe, stack, replies)
    return replies


def noscript_resends(stack: list[tuple[tuple[Any, ...], dict[str, Any]]],
                     replies: list[Any]) -> list[int]:
    """Which commands of a pipeline to send again after reloading the scripts: those
    answered NOSCRIPT (they never ran), and every WAIT after the first of them."""
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if not missing:
        return []
    return sorted(set(missing) | {i for i in range(missing[0], len(stack))
                                  if str(stack[i][0][0]).upper() == "WAIT"})


def raise_first_error(pipe: Any, stack: list[tuple[tuple[Any, ...], dict[str, Any]]],
                      replies: list[Any]) -> None:
    for i, reply in enumerate(replies):
        if isinstance(reply, Exception):
            pipe.annotate_exception(reply, i + 1, stack[i][0])
            raise reply


class ForqRedis(redis.Redis):
    """`redis.Redis` whose non-transactional pipelines are `ScriptPipeline`s."""

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        if transaction:
            return super().pipeline(transaction=True, shard_hint=shard_hint)
        return ScriptPipeline(self.connection_pool, self.response_callbacks, False, shard_hint)
