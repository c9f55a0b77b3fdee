"""One way to open a Redis client from a URL, the same for producers, CLI and supervisor."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import redis

from forq.store import topology
from forq.store.scripts import ForqRedis

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def redis_url(url: str | None = None) -> str:
    """The URL to use: the one given, else ``FORQ_REDIS_URL``, else the local default."""
    return url or os.environ.get("FORQ_REDIS_URL") or DEFAULT_URL


def connect(url: str | None = None, *, password: str | None = None, **kwargs: Any) -> redis.Redis:
    """A client for redis://, rediss:// (TLS) or unix:// URLs; for a Redis Cluster
    (redis+cluster://host:port,host:port, or ``cluster=True``) or the master behind
    Sentinels (redis+sentinel://host:port,host:port/mastername[/db]), see `topology`.

    The password comes from the URL, else `password`, else ``FORQ_REDIS_PASSWORD``:
    secrets belong in the environment or a file, not in a world-readable config.
    """
    url = redis_url(url)
    options = client_options(kwargs)
    if options.pop("cluster", False):
        url = topology.as_cluster_url(url)
    if topology.is_topology_url(url):  # redis+cluster://, redis+sentinel://
        client: redis.Redis = topology.connect(url, password=password, **options)
        return client
    client = ForqRedis.from_url(url, **options)
    add_password(client.connection_pool.connection_kwargs, password)
    return client


def client_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """forq's defaults for a client (str replies, a bounded connect), then `kwargs`."""
    options: dict[str, Any] = {"decode_responses": True, "socket_connect_timeout": 5,
                               "health_check_interval": 30}
    options.update(kwargs)
    return options


def add_password(conn_kwargs: dict[str, Any], password: str | None) -> None:
    """Without a password in the URL: `password`, else ``FORQ_REDIS_PASSWORD``."""
    if not conn_kwargs.get("password"):
        secret = password or os.environ.get("FORQ_REDIS_PASSWORD")
        if secret:
            conn_kwargs["password"] = secret


def describe(url: str) -> str:
    """Where `url` points, for logs and status lines: ``127.0.0.1:6379/0``,
    ``unix:/run/redis.sock/0``, ``cluster 10.0.0.1:7000,10.0.0.2:7001`` or ``sentinel
    master mymaster via 10.0.0.1:26379/0`` — never the username or password."""
    try:
        if topology.is_topology_url(url):
            parts = topology.parse_url(url)
            hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in parts["hosts"])
            tls = " (TLS)" if parts["ssl"] else ""
            if parts["kind"] == "cluster":
                return f"cluster {hosts}{tls}"
            return f"sentinel master {parts['master']} via {hosts}/{parts['db']}{tls}"
        split = urlsplit(url)
        if split.scheme == "unix":
            db = dict(q.split("=", 1) for q in split.query.split("&") if "=" in q).get("db", "0")
            return f"unix:{split.path}/{db}"
        host = f"[{split.hostname}]" if ":" in (split.hostname or "") else split.hostname
        db = split.path.strip("/") or "0"
        tls = " (TLS)" if split.scheme == "rediss" else ""
        return f"{host}:{split.port or 6379}/{db}{tls}"
    except ValueError:
        return "an unparsable URL"
