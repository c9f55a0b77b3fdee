"""The `[redis]` table: where forq's Redis is (the file, or FORQ_REDIS_URL), its
password (FORQ_REDIS_PASSWORD or `password_file`, never the TOML), replication waits and
eviction. A URL is checked, and redacted wherever it is printed."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from forq.store.connection import describe
from forq.store.topology import as_cluster_url, is_topology_url, url_problem
from forq.supervisor.config import fields as read

log = logging.getLogger("forq.supervisor")

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_KEYS = ("url", "password_file", "cluster", "min_replicas", "wait_timeout",
              "allow_eviction")


def read_redis(
    doc: Mapping[str, Any], env: Mapping[str, str], base_dir: Path
) -> tuple[str, str | None]:
    table = read.table(doc.get("redis", {}), "[redis]")
    read.check_keys(table, REDIS_KEYS, "[redis]")
    url = read.string(
        table.get("url", DEFAULT_REDIS_URL), "[redis].url", "a redis://, rediss:// or unix:// URL"
    )
    check_url(url, "[redis].url")
    if urlsplit(url).password:
        raise read.Invalid(
            "[redis].url: contains a password; secrets do not belong in this file, "
            "use [redis].password_file or FORQ_REDIS_PASSWORD"
        )
    if env.get("FORQ_REDIS_URL"):
        url = env["FORQ_REDIS_URL"]
        check_url(url, "FORQ_REDIS_URL")
    cluster = table.get("cluster", False)
    if not isinstance(cluster, bool):
        raise read.expected("[redis].cluster", "true or false", cluster)
    if cluster:
        url = as_cluster_url(url)  # any node's redis:// URL → redis+cluster://
        if "+cluster://" not in url:
            raise read.Invalid("[redis].cluster: true needs a redis:// or redis+cluster:// URL, "
                           f"got {redact(url)}")

    password_file = table.get("password_file")
    if password_file is not None:
        read.string(password_file, "[redis].password_file", "a file path")
    if env.get("FORQ_REDIS_PASSWORD"):
        return url, env["FORQ_REDIS_PASSWORD"]
    if password_file is None:
        return url, None
    file_path = base_dir / os.path.expanduser(password_file)
    try:
        password = file_path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise read.Invalid(f"[redis].password_file: missing file {file_path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise read.Invalid(f"[redis].password_file: cannot read {file_path}: {reason}") from None
    if not password:
        raise read.Invalid(f"[redis].password_file: {file_path} is empty")
    return url, password


def url_source(doc: Mapping[str, Any], shown: str, env: Mapping[str, str]) -> str:
    if env.get("FORQ_REDIS_URL"):
        return "FORQ_REDIS_URL"
    if "url" in doc.get("redis", {}):
        return f"[redis].url in {shown}"
    return f"the default: no [redis].url in {shown}"


def password_file_path(doc: Mapping[str, Any], base_dir: Path) -> str | None:
    name = doc.get("redis", {}).get("password_file")
    return str(base_dir / os.path.expanduser(name)) if isinstance(name, str) else None


def read_replication(doc: Mapping[str, Any]) -> dict[str, Any]:
    """[redis].min_replicas (WAIT for that many replicas after each report batch) and
    [redis].wait_timeout (how long, at most)."""
    table = doc.get("redis", {})
    out: dict[str, Any] = {}
    if "allow_eviction" in table:
        if not isinstance(table["allow_eviction"], bool):
            raise read.expected("[redis].allow_eviction", "true or false", table["allow_eviction"])
        out["redis_allow_eviction"] = table["allow_eviction"]
    if "min_replicas" in table:
        out["redis_min_replicas"] = read.integer(table["min_replicas"], "[redis].min_replicas", 0, 16)
    if "wait_timeout" in table:
        out["redis_wait_timeout"] = read.duration(table["wait_timeout"], "[redis].wait_timeout",
                                              positive=True)
    return out


def check_url(url: str, where: str) -> None:
    shown = redact(url)
    what = 'a URL such as "redis://127.0.0.1:6379/0", rediss:// or unix://'
    if is_topology_url(url):  # redis+cluster:// or redis+sentinel:// (jobs/store/topology.py)
        problem = url_problem(url)
        if problem:
            raise read.expected(where, problem, shown)
        return
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. a malformed IPv6 host
        raise read.expected(where, what, shown) from None
    ok = parts.scheme in ("redis", "rediss") and bool(parts.hostname)
    ok = ok or (parts.scheme == "unix" and bool(parts.path))
    if not ok:
        raise read.expected(where, what, shown)
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise read.expected(where, "a URL with a port from 0 to 65535", shown) from None


def redact(url: str) -> str:
    """Hide a password in a URL we are about to print in an error."""
    head, at, host = url.rpartition("@")
    if not at or ":" not in head.partition("//")[2]:
        return url
    scheme, slashes, user = head.rpartition("//")
    return f"{scheme}{slashes}{user.partition(':')[0]}:***@{host}"


def keep_redis_url(old: Any, new: Any) -> Any:
    """A reloaded config keeps the Redis the supervisor connected to (`--redis`, or the
    URL it started with): a new URL takes effect at the next start, with a warning."""
    if new.redis_url == old.redis_url and old.redis_url_source != "--redis":
        return new
    if old.redis_url_source != "--redis":
        log.warning("the Redis URL changed (%s, from %s): it takes effect at the next start, "
                    "not on reload", describe(new.redis_url), new.redis_url_source)
    return dataclasses.replace(new, redis_url=old.redis_url,
                               redis_url_source=old.redis_url_source)
