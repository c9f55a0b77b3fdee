"""Topologies beyond one Redis: Redis Cluster, Sentinel, and replicated writes (WAIT).

URLs (what `forq.store.connection.connect` accepts besides redis://, rediss:// and unix://):

* ``redis+cluster://host:port,host:port`` (``rediss+cluster://`` for TLS): a Redis
  Cluster, reached through any of the listed nodes (the client discovers the rest).
* ``redis+sentinel://host:port,host:port/mastername[/db]`` (``rediss+sentinel://``):
  the master Sentinel names, found again by asking the Sentinels after a failover.

Redis Cluster. Every key of a queue carries the hash tag ``{queue}``, so every script
runs on the one shard that owns the queue, and queues spread over the shards. Two things
of redis-py's cluster client needed help, done by `ForqCluster`/`ForqClusterPipeline`:

* A cluster pipeline refuses ``evalsha()`` and has no script cache, so a script called
  on it would either fail or, after a shard restarted or failed over (scripts are not
  replicated to replicas with effects replication), answer NOSCRIPT. Our pipeline
  queues EVALSHA as a plain command and, after `execute`, re-sends only the commands
  answered NOSCRIPT, once, after SCRIPT LOAD on every primary: a NOSCRIPT reply means
  the script never ran, so this can never apply a transition twice. (A re-sent script
  runs after the pipeline's other commands, so the WAITs that followed it are re-sent
  as well.) Keeping EVALSHA
  (rather than sending every script's source with EVAL) keeps a claim a few hundred
  bytes on the wire instead of ~10 KB.
* ``command_stack`` of a cluster pipeline is a dead list in redis-py 6+ (the queue lives
  in its execution strategy); ours shows the live queue, as a plain pipeline's does.

Pub/sub: classic PUBLISH (what the scripts send) is broadcast to every node of a
cluster, so one subscription on any node hears every queue's wake-ups;
``RedisCluster.pubsub()`` opens it on the node serving the first channel's slot.

Replicated writes: ``WAIT n timeout`` blocks until the writes sent earlier *on the same
connection* reached n replicas. It therefore always goes into the same pipeline as the
writes it covers (a cluster pipeline sends each node's commands on one connection, so
the WAIT is addressed to the node that owns the written queue). See `queue_wait`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from forq.errors import NotReplicated
from forq.store.scripts import ForqRedis, finish_pipeline

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_WAIT_TIMEOUT = 1.0  # seconds a durable write waits for its replicas
CLUSTER_EXAMPLE = '"redis+cluster://host:port,host:port"'
SENTINEL_EXAMPLE = '"redis+sentinel://host:port,host:port/mastername"'


# -- URLs ------------------------------------------------------------------------------


def scheme_of(url: str) -> str:
    return url.partition("://")[0].lower() if "://" in url else ""


def is_topology_url(url: str) -> bool:
    return scheme_of(url) in CLUSTER_SCHEMES + SENTINEL_SCHEMES


def as_cluster_url(url: str) -> str:
    """``redis://h:p`` → ``redis+cluster://h:p`` (for ``[redis] cluster = true``)."""
    scheme = scheme_of(url)
    if scheme in ("redis", "rediss"):
        return f"{scheme}+cluster://{url.partition('://')[2]}"
    return url


def _hosts(netloc: str, default_port: int) -> tuple[list[tuple[str, int]], str | None, str | None]:
    """Parse ``[user[:password]@]host[:port],host[:port]`` into hosts and credentials."""
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    hosts = []
    for item in hostlist.split(","):
        item = item.strip()
        if not item:
            raise ValueError("an empty host in the host list")
        if item.startswith("["):  # [ipv6]:port
            host, _, rest = item[1:].partition("]")
            port_text = rest.lstrip(":")
        else:
            host, _, port_text = item.rpartition(":") if ":" in item else (item, "", "")
        if not host:
            raise ValueError(f"no host in {item!r}")
        try:
            port = int(port_text) if port_text else default_port
        except ValueError:
            raise ValueError(f"bad port in {item!r}") from None
        if not 0 < port < 65536:
            raise ValueError(f"port out of range in {item!r}")
        hosts.append((host, port))
    return hosts, username, password


def parse_url(url: str) -> dict[str, Any]:
    """Split a cluster or sentinel URL: kind, hosts, ssl, username, password, and for
    Sentinel the master name and db. ValueError (saying what is wrong) on a bad URL."""
    scheme = scheme_of(url)
    if scheme not in CLUSTER_SCHEMES + SENTINEL_SCHEMES:
        raise ValueError(f"not a cluster or sentinel URL: {url!r}")
    sentinel = scheme in SENTINEL_SCHEMES
    rest = url.partition("://")[2]
    netloc, _, path = rest.partition("/")
    path, _, query = path.partition("?")
    if query:
        raise ValueError("query options are not supported in this URL")
    hosts, username, password = _hosts(netloc, 26379 if sentinel else 6379)
    parts: dict[str, Any] = {"kind": "sentinel" if sentinel else "cluster", "hosts": hosts,
                             "ssl": scheme.startswith("rediss"), "username": username,
                             "password": password, "db": 0, "master": None}
    segments = [s for s in path.split("/") if s]
    if sentinel:
        if not segments:
            raise ValueError("no master name after the hosts (…/mastername)")
        parts["master"] = unquote(segments[0])
        if len(segments) > 2:
            raise ValueError("expected /mastername or /mastername/db after the hosts")
        if len(segments) == 2:
            if not segments[1].isdigit():
                raise ValueError(f"db {segments[1]!r} is not a number")
            parts["db"] = int(segments[1])
    elif segments and segments != ["0"]:
        raise ValueError("a Redis Cluster has only db 0")
    return parts


def url_problem(url: str) -> str | None:
    """None for a good cluster/sentinel URL, else what was expected (for config errors)."""
    try:
        parse_url(url)
    except ValueError as exc:
        example = SENTINEL_EXAMPLE if scheme_of(url) in SENTINEL_SCHEMES else CLUSTER_EXAMPLE
        return f"a URL such as {example} ({exc})"
    return None


# -- clients ---------------------------------------------------------------------------


class _ScriptKeys:
    """redis-py 8 asks a server (COMMAND GETKEYS, one extra round trip) for the keys of
    every command whose keys move: EVALSHA, and XREAD. They are right there in its
    arguments; and the node it asks may be the one that is down, which would stall a
    `job.wait` on a healthy shard."""

    def _get_command_keys(self, *args: Any) -> Any:
        name = str(args[0]).upper() if args else ""
        if len(args) > 2 and name in ("EVAL", "EVALSHA"):
            return list(args[3:3 + int(args[2])])
        if name == "XREAD":
            words = [str(a).upper() for a in args]
            if "STREAMS" in words:
                rest = args[words.index("STREAMS") + 1:]
                return list(rest[:len(rest) // 2])
        return super()._get_command_keys(*args)  # type: ignore[misc]


class ForqClusterPipeline(_ScriptKeys, ClusterPipeline):
    """A non-transactional cluster pipeline that runs scripts by EVALSHA and re-sends
    the ones a node answered NOSCRIPT (see the module docstring)."""

    _forq_client: ForqCluster

    @property
    def command_stack(self) -> list[Any]:
        queue: list[Any] = self._execution_strategy.command_queue
        return queue

    @command_stack.setter
    def command_stack(self, _value: list[Any]) -> None:
        pass  # ClusterPipeline.__init__ assigns a list nobody reads

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    def time(self, **kwargs: Any) -> Any:  # blocked in redis-py's cluster pipelines; harmless here
        return self.execute_command("TIME", **kwargs)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = [(tuple(c.args), dict(c.options)) for c in self._execution_strategy.command_queue]
        replies = super().execute(raise_on_error=False)
        client = self._forq_client
        return finish_pipeline(self, stack, replies, client.load_scripts,
                               lambda: client.pipeline(transaction=False), raise_on_error)


class ForqCluster(_ScriptKeys, RedisCluster):
    """`RedisCluster` whose pipelines run forq's scripts (see `ForqClusterPipeline`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._forq_scripts: dict[str, str] = {}

    def command(self, **kwargs: Any) -> Any:
        """COMMAND (the table of keys redis-py reads once, while the client is made)
        from the first primary that answers: one node down must not stop a supervisor
        from starting and serving the other shards."""
        error: BaseException | None = None
        for node in self.get_primaries():
            try:
                return self.execute_command("COMMAND", target_nodes=node, **kwargs)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                error = exc
        if error is not None:
            raise error
        return super().command(**kwargs)

    def register_script(self, script: bytes | str | memoryview) -> Any:
        registered = super().register_script(script)
        self._forq_scripts[registered.sha] = (script if isinstance(script, str)
                                              else bytes(script).decode())
        return registered

    def load_scripts(self, shas: Iterable[str] | None = None) -> None:
        """SCRIPT LOAD the registered scripts (or only `shas`) on every primary."""
        for sha in list(shas) if shas is not None else list(self._forq_scripts):
            text = self._forq_scripts.get(sha)
            if text is not None:
                self.script_load(text)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction=transaction, shard_hint=shard_hint)
        if not transaction:
            pipe.__class__ = ForqClusterPipeline
            pipe._forq_client = self
        return pipe


def connect_cluster(url: str, *, password: str | None = None, **options: Any) -> ForqCluster:
    parts = parse_url(url)
    options = dict(options)
    options.pop("health_check_interval", None)  # not a cluster option in redis-py
    options.setdefault("decode_responses", True)
    if parts["ssl"]:
        options["ssl"] = True
    if parts["username"]:
        options["username"] = parts["username"]
    secret = parts["password"] or password or os.environ.get("FORQ_REDIS_PASSWORD")
    if secret:
        options["password"] = secret
    nodes = [ClusterNode(host, port) for host, port in parts["hosts"]]
    return ForqCluster(startup_nodes=nodes, **options)


def sentinel_settings(url: str, password: str | None,
                      options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(parsed URL, the Sentinels' connection options, the master's) for a sentinel
    URL: one reading for the sync and the asyncio client."""
    parts = parse_url(url)
    options = dict(options)
    options.setdefault("decode_responses", True)
    sentinel_kwargs = {k: v for k, v in options.items()
                       if k in ("socket_timeout", "socket_connect_timeout")}
    sentinel_password = os.environ.get("FORQ_SENTINEL_PASSWORD")
    if sentinel_password:
        sentinel_kwargs["password"] = sentinel_password
    if parts["ssl"]:
        options["ssl"] = True
        sentinel_kwargs["ssl"] = True
    if parts["username"]:
        options["username"] = parts["username"]
    secret = parts["password"] or password or os.environ.get("FORQ_REDIS_PASSWORD")
    if secret:
        options["password"] = secret
    options["db"] = parts["db"]
    return parts, sentinel_kwargs, options


def connect_sentinel(url: str, *, password: str | None = None, **options: Any) -> redis.Redis:
    """The master behind the Sentinels: every new connection asks them where it is,
    so after a failover the client reconnects to the promoted replica by itself."""
    parts, sentinel_kwargs, options = sentinel_settings(url, password, options)
    sentinel = Sentinel(parts["hosts"], sentinel_kwargs=sentinel_kwargs)
    master: redis.Redis = sentinel.master_for(parts["master"], redis_class=ForqRedis, **options)
    return master


def connect(url: str, *, password: str | None = None, cluster: bool = False,
            **options: Any) -> Any:
    """A client for a cluster or sentinel URL (or, with `cluster`, a redis:// URL of
    any cluster node)."""
    if cluster:
        url = as_cluster_url(url)
    if scheme_of(url) in SENTINEL_SCHEMES:
        return connect_sentinel(url, password=password, **options)
    return connect_cluster(url, password=password, **options)


def is_cluster(client: Any) -> bool:
    return isinstance(client, (RedisCluster, ClusterPipeline))


# -- replicated writes (WAIT) -------------------------------------------------------------


def set_durability(client: Any, min_replicas: int, wait_timeout: float = DEFAULT_WAIT_TIMEOUT) -> None:
    """Make every enqueue through `client` (by any `Queue` built on it) wait until
    `min_replicas` replicas hold the write, or raise `NotReplicated`."""
    client.forq_min_replicas = int(min_replicas)
    client.forq_wait_timeout = float(wait_timeout)


def durability(client: Any, durable: bool | None, min_replicas: int | None,
               wait_timeout: float | None) -> tuple[int, int]:
    """(replicas to wait for, timeout in ms) for one write: the queue's setting, else
    the client's (`set_durability`); ``durable=True`` asks for at least one replica,
    ``durable=False`` for none."""
    if durable is False:
        return 0, 0
    replicas = min_replicas if min_replicas is not None else getattr(client, "forq_min_replicas", 0)
    timeout = wait_timeout if wait_timeout is not None else getattr(
        client, "forq_wait_timeout", DEFAULT_WAIT_TIMEOUT)
    if durable:
        replicas = max(1, replicas or 0)
    return int(replicas or 0), max(1, int(round(timeout * 1000)))


def queue_wait(pipe: Any, replicas: int, timeout_ms: int, keys: Sequence[str]) -> int:
    """Append ``WAIT replicas timeout_ms`` to `pipe`, after the writes it covers: once
    on a plain pipeline, once per node owning one of `keys` on a cluster pipeline.
    Returns how many WAIT replies the pipeline will end with."""
    if not isinstance(pipe, ClusterPipeline):
        pipe.execute_command("WAIT", replicas, timeout_ms)
        return 1
    nodes: dict[str, Any] = {}
    for key in keys:
        node = pipe.get_node_from_key(key)
        nodes.setdefault(node.name, node)
    for node in nodes.values():
        pipe.execute_command("WAIT", replicas, timeout_ms, target_nodes=node)
    return len(nodes)


def short_of(wait_replies: Sequence[Any], replicas: int) -> int | None:
    """The fewest replicas any WAIT reported when short of `replicas`, else None.
    An error reply (the WAIT itself failed) counts as none."""
    counts = [r if isinstance(r, int) else 0 for r in wait_replies]
    low = min(counts) if counts else 0
    return low if low < replicas else None


def check_wait(wait_replies: Sequence[Any], replicas: int, timeout_ms: int,
               job_ids: Sequence[str], what: str = "enqueue") -> None:
    """Raise `NotReplicated` naming the jobs when a WAIT came back short."""
    acknowledged = short_of(wait_replies, replicas)
    if acknowledged is not None:
        raise NotReplicated(list(job_ids), acknowledged, replicas, timeout_ms, what)


def fail_fast(url: str) -> dict[str, Any]:
    """Client options for a supervisor: on a cluster, no retries inside redis-py (its
    default re-sends a silent node's commands for seconds, while every lease waits);
    the supervisor retries by itself, shard by shard (`forq.supervisor.redis_io.shards`)."""
    if scheme_of(url) not in CLUSTER_SCHEMES:
        return {}
    return {"retry": Retry(NoBackoff(), 0)}
