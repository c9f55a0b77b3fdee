"""The `[redis]` table: where forq's Redis is (the file, or FORQ_REDIS_URL), its
password (FORQ_REDIS_PASSWORD or `password_file`, never the TOML), replication waits and
eviction. A URL is checked, and redacted wherever it is printed."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from forq.store.connection import describe
from forq.store.topology import as_cluster_url, is_topology_url, url_problem
from forq.supervisor.config import fields as read

if TYPE_CHECKING:
    from forq.supervisor.config.load import Config

log = logging.getLogger("forq.supervisor")

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _url(value: object, where: str) -> str:
    url = read.string(value, where, "a redis://, rediss:// or unix:// URL")
    check_url(url, where)
    if urlsplit(url).password:
        raise read.Invalid(
            f"{where}: contains a password; secrets do not belong in this file, "
            "use [redis].password_file or FORQ_REDIS_PASSWORD"
        )
    return url


# the readers of the [redis] rows, which are fields of `Config` (load.py)
URL = read.Reader("a redis://, rediss:// or unix:// URL", _url)
FILE_PATH = read.strings("a file path")


def resolve(config: Config, table: Mapping[str, Any], env: Mapping[str, str], base_dir: Path,
            shown: str) -> Config:
    """`config` with the Redis the supervisor will use: FORQ_REDIS_URL over [redis].url,
    a redis+cluster:// URL for `cluster = true`, the password from FORQ_REDIS_PASSWORD
    or else `password_file` (read now, relative to the config file's folder). `table` is
    the [redis] table as written (to say where the URL came from)."""
    url, source = config.redis_url, f"[redis].url in {shown}"
    if "url" not in table:
        source = f"the default: no [redis].url in {shown}"
    if env.get("FORQ_REDIS_URL"):
        url, source = env["FORQ_REDIS_URL"], "FORQ_REDIS_URL"
        check_url(url, "FORQ_REDIS_URL")
    if config.redis_cluster:
        url = as_cluster_url(url)  # any node's redis:// URL → redis+cluster://
        if "+cluster://" not in url:
            raise read.Invalid("[redis].cluster: true needs a redis:// or redis+cluster:// URL, "
                               f"got {redact(url)}")
    password_file = None
    if config.redis_password_file is not None:
        password_file = base_dir / os.path.expanduser(config.redis_password_file)
    if env.get("FORQ_REDIS_PASSWORD"):
        password: str | None = env["FORQ_REDIS_PASSWORD"]
    else:
        password = None if password_file is None else _read_password(password_file)
    return dataclasses.replace(
        config, redis_url=url, redis_url_source=source, redis_password=password,
        redis_password_file=None if password_file is None else str(password_file))


def _read_password(file_path: Path) -> str:
    try:
        password = file_path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise read.Invalid(f"[redis].password_file: missing file {file_path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise read.Invalid(f"[redis].password_file: cannot read {file_path}: {reason}") from None
    if not password:
        raise read.Invalid(f"[redis].password_file: {file_path} is empty")
    return password


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
