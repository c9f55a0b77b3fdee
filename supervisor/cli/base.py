"""What every `forq` command shares: its two kinds of error, the Redis client and the
config it was pointed at, and JSON in and out.

A command raises `UsageError` (exit 2) or `Failure` (exit 1) with a message already
worded for the user; `forq.supervisor.cli.main` turns them into one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Any, NoReturn

import redis

from forq import Queue
from forq.store.connection import connect

DEFAULT_CONFIG = "/etc/forq/forq.toml"


class UsageError(Exception):
    """A mistake in the command line: exit code 2."""


class Failure(Exception):
    """A runtime failure already worded for the user: exit code 1."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (pointing at --help), not usage + error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


@dataclass(frozen=True)
class Parents:
    """The option groups commands inherit (argparse ``parents=``)."""

    common: Parser  # --redis, also after the command name
    inspect: Parser  # common + --json
    with_config: Parser  # --config: take the Redis URL from a supervisor config


def redis_for(args: argparse.Namespace) -> redis.Redis:
    """--redis, else FORQ_REDIS_URL, else the --config file's URL, else the default."""
    url = getattr(args, "redis", None) or os.environ.get("FORQ_REDIS_URL") or None
    password = None
    if getattr(args, "config", None):
        config = config_of(args)
        url = url or config.redis_url
        password = config.redis_password
    try:
        return connect(url, password=password)
    except ValueError as exc:
        raise UsageError(f"bad Redis URL: {exc}") from None


def config_of(args: argparse.Namespace) -> Any:
    """The supervisor config named by --config, loaded once per command."""
    cached = getattr(args, "_loaded_config", None)
    if cached is None:
        from forq.supervisor.config.load import ConfigError, load_config

        try:
            cached = load_config(args.config)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        args._loaded_config = cached
    return cached


def queue_named(name: str, client: redis.Redis) -> Queue:
    try:
        return Queue(name, redis=client)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def json_arg(text: str | None, what: str, kind: type) -> Any:
    """--args / --kwargs: JSON of the given kind (list or dict), empty when absent."""
    if text is None:
        return kind()
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--{what} is not valid JSON: {exc}") from None
    if not isinstance(value, kind):
        raise UsageError(f"--{what} must be a JSON {'array' if kind is list else 'object'}, "
                         f"got {type(value).__name__}")
    return value


def duration_arg(text: str, option: str, *, positive: bool = False) -> float:
    """A duration option ("30s", "2m") in seconds, read as the config reads one; a bad
    one is a usage error."""
    from forq.supervisor.config import fields as config_fields

    try:
        return config_fields.duration(text, option, positive=positive)
    except config_fields.Invalid as exc:
        raise UsageError(str(exc)) from None


def size_arg(text: str, option: str) -> int:
    """A size option ("512MiB") in bytes, read as the config reads one; a bad one is a
    usage error."""
    from forq.supervisor.config import fields as config_fields

    try:
        return config_fields.size(text, option)
    except config_fields.Invalid as exc:
        raise UsageError(str(exc)) from None


def emit(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def redis_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return int(seconds) + int(micros) / 1e6
