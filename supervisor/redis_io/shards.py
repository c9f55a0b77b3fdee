"""Shards: run a Redis Cluster pipeline node by node, so a node that is down (or
silent: a SIGSTOPped or partitioned server) fails only the commands addressed to it.

redis-py's cluster pipeline raises for the whole pipeline when one node fails, after
re-sending that node's commands one by one (seven seconds with a stopped node and the
default retries): a supervisor whose lease extensions ride one such pipeline would
fence the children of every shard for the sake of one. `execute_by_shard` sends each
node its own plain pipeline (on the cluster client's connection to that node) and
answers every command of an unreachable node with a `ShardDown` reply, the others with
their own replies. What the cluster pipeline did for us, done here:

* NOSCRIPT (a node restarted or failed over) reloads the scripts on that node and
  re-sends the commands answered NOSCRIPT (they never ran), as `ForqClusterPipeline`;
* MOVED/ASK (a resharding or a failover moved the slot) re-sends those commands,
  which did not run either, through a cluster pipeline, which follows the redirection
  and refreshes the slot map;
* after a node failed, the slot map is refreshed (at most every `REFRESH_EVERY`
  seconds), so a replica promoted in its place is found.

On a plain Redis (or Sentinel) there is one shard, named ``""`` (`PLAIN`), and the
pipeline runs as it always did: one round trip, an error raised for the whole.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import AskError, MovedError, TryAgainError

from forq.store.keys import FORMAT as FORMAT_KEY
from forq.store.scripts import finish_pipeline
from forq.store.topology import is_cluster

PLAIN = ""  # the one shard of a plain Redis
REFRESH_EVERY = 5.0  # seconds between two slot-map refreshes after a node failed


class ShardDown(redis.ConnectionError):
    """The reply of a command whose node could not be reached (it did not run, or
    it ran and its answer was lost: a fenced transition sent again is answered lost)."""

    def __init__(self, shard: str, cause: BaseException) -> None:
        super().__init__(f"redis shard {shard} unreachable: {cause}")
        self.shard = shard
        self.cause = cause


@dataclass
class ShardReplies:
    replies: list[Any]
    failed: dict[str, BaseException] = field(default_factory=dict)  # shard -> its error
    answered: set[str] = field(default_factory=set)  # shards that answered


def shard_of(client: Any, queue: str) -> str:
    """The name (host:port) of the node serving `queue`'s slot, or `PLAIN`."""
    if not is_cluster(client):
        return PLAIN
    slot = client.keyslot(f"forq:{{{queue}}}:")
    try:
        return str(client.nodes_manager.get_node_from_slot(slot).name)
    except redis.RedisError:  # a slot no node serves (the cluster is being reshaped)
        return f"slot {slot}"


def ping_home(client: Any) -> Any:
    """PING what a supervisor needs to start: on a cluster the node holding forq's data
    format (`dataformat`), not every node (one shard down must not keep it waiting)."""
    if not is_cluster(client):
        return client.ping()
    return client.execute_command("PING", target_nodes=client.get_node_from_key(FORMAT_KEY))


def execute_by_shard(pipe: Any, down: Collection[str] = ()) -> ShardReplies:
    """Run `pipe` (raise_on_error=False) one node at a time, the nodes in `down` last
    (a silent node costs a socket timeout: the others' answers come first). On a plain
    pipeline: one round trip, a connection error raised as before."""
    if not is_cluster(pipe):
        return ShardReplies(pipe.execute(raise_on_error=False), answered={PLAIN})
    client = pipe._forq_client
    stack = [(tuple(c.args), dict(c.options)) for c in pipe.command_stack]
    pipe.reset()
    groups: dict[str, list[int]] = {}
    nodes: dict[str, Any] = {}
    out = ShardReplies([None] * len(stack))
    for i, (args, options) in enumerate(stack):
        try:
            node = _node_for(client, args, options)
        except redis.RedisError as exc:
            out.replies[i] = ShardDown("(no node)", exc)
            continue
        groups.setdefault(node.name, []).append(i)
        nodes[node.name] = node
    # every node's commands written before any is read, as one cluster pipeline did:
    # the nodes work at once, and a silent node's timeout is waited for last
    order = sorted(groups, key=lambda n: n in down)
    trips = [_NodeTrip(client, nodes[name], [stack[i] for i in groups[name]]) for name in order]
    for name, trip in zip(order, trips, strict=True):
        indexes = groups[name]
        try:
            replies = trip.finish()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            out.failed[name] = exc
            replies = [ShardDown(name, exc)] * len(indexes)
            _refresh_slots(client)
        else:
            out.answered.add(name)
        for i, reply in zip(indexes, replies, strict=True):
            out.replies[i] = reply
    return out


def _node_for(client: Any, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    target = options.get("target_nodes")  # a WAIT addressed to the node it vouches for
    if target is not None:
        return target[0] if isinstance(target, list) else target
    keys = client._get_command_keys(*args)
    if not keys:
        return client.get_default_node()
    return client.nodes_manager.get_node_from_slot(client.keyslot(keys[0]))


class _NodeTrip:
    """One node's commands on one of its connections: sent at once (`__init__`), read
    later (`finish`), as redis-py's own pipeline does but split in two."""

    def __init__(self, client: Any, node: Any,
                 stack: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> None:
        self.client = client
        self.node = node
        self.redis = client.get_redis_connection(node)  # the node's own client
        self.stack = stack
        self.connection: Any = None
        self.error: BaseException | None = None
        try:
            self.connection = self.redis.connection_pool.get_connection()
            self.connection.send_packed_command(
                self.connection.pack_commands([args for args, _ in stack]))
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self.error = exc
            self._release(dirty=True)

    def _release(self, dirty: bool) -> None:
        if self.connection is None:
            return
        if dirty:  # replies may still be on their way: never hand this socket out again
            self.connection.disconnect()
        self.redis.connection_pool.release(self.connection)
        self.connection = None

    def finish(self) -> list[Any]:
        """The replies (an error reply in place); raises when the node did not answer."""
        if self.error is not None:
            raise self.error
        replies: list[Any] = []
        try:
            for args, options in self.stack:
                try:
                    replies.append(self.redis.parse_response(self.connection, args[0],
                                                             **_plain(options)))
                except redis.ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            self._release(dirty=True)
            raise
        self._release(dirty=False)
        return self._redo(replies)

    def _redo(self, replies: list[Any]) -> list[Any]:
        """Send again what did not run: NOSCRIPT (the scripts loaded on this node
        first) and MOVED/ASK (through a cluster pipeline, which follows them)."""
        conn, client, stack = self.redis, self.client, self.stack

        def reload(shas: Any) -> None:
            for sha in shas:
                text = client._forq_scripts.get(sha)
                if text is not None:
                    conn.script_load(text)

        def fresh() -> Any:
            pipe = conn.pipeline(transaction=False)
            pipe.execute_command = _without_targets(pipe.execute_command)
            return pipe

        replies = finish_pipeline(None, stack, replies, reload, fresh, False)
        moved = [i for i, r in enumerate(replies)
                 if isinstance(r, (MovedError, AskError, TryAgainError))]
        if moved:
            again = client.pipeline(transaction=False)
            for i in moved:
                again.execute_command(*stack[i][0], **stack[i][1])
            try:
                redirected = again.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                redirected = [ShardDown(f"(moved from {self.node.name})", exc)] * len(moved)
            for i, reply in zip(moved, redirected, strict=True):
                replies[i] = reply
        return list(replies)


def _without_targets(execute: Any) -> Any:
    def call(*args: Any, **options: Any) -> Any:
        return execute(*args, **_plain(options))
    return call


def _plain(options: dict[str, Any]) -> dict[str, Any]:
    """A cluster pipeline's command options, less those a node's own pipeline refuses."""
    return {k: v for k, v in options.items() if k != "target_nodes"}


def _refresh_slots(client: Any) -> None:
    now = time.monotonic()
    if now - getattr(client, "_forq_slots_refreshed", -REFRESH_EVERY) < REFRESH_EVERY:
        return
    client._forq_slots_refreshed = now
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, OSError):
        pass  # no node answered: the next failure tries again
