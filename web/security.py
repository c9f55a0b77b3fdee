"""Who may look, and which POSTs are the operator's own: optional auth and CSRF tokens.

Auth is off unless a secret is given, from the environment or a file (never the TOML,
which may be world-readable): a bearer token (``FORQ_WEB_TOKEN`` / ``--token-file``;
a browser signs in once with ``/?token=...``, kept in an HttpOnly cookie) and/or
basic auth (``FORQ_WEB_BASIC_AUTH`` / ``--basic-auth-file``, "user:password").

CSRF: every page carries a per-browser random token in an HttpOnly, SameSite=Strict
cookie and the same token in each form; a POST whose form token does not match its
cookie, or whose Origin is another site, is refused. Another site can neither read
the token nor send the cookie.
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

CSRF_COOKIE = "forq_csrf"
CSRF_FIELD = "csrf"
TOKEN_COOKIE = "forq_token"


class SecretError(Exception):
    """A secret file that cannot be used: the message names it."""


def _read_secret(path: str, what: str) -> str:
    try:
        text = Path(path).read_text().strip()
    except OSError as exc:
        raise SecretError(f"cannot read the {what} file {path}: {exc.strerror or exc}") from None
    if not text:
        raise SecretError(f"the {what} file {path} is empty")
    return text


@dataclass(frozen=True)
class Auth:
    token: str | None = None
    basic: str | None = None  # "user:password"

    @property
    def enabled(self) -> bool:
        return bool(self.token or self.basic)

    @classmethod
    def from_sources(cls, token_file: str | None = None,
                     basic_auth_file: str | None = None) -> Auth:
        """A file given on the command line wins over the environment variable."""
        token = (_read_secret(token_file, "token") if token_file
                 else os.environ.get("FORQ_WEB_TOKEN") or None)
        basic = (_read_secret(basic_auth_file, "basic auth") if basic_auth_file
                 else os.environ.get("FORQ_WEB_BASIC_AUTH") or None)
        if basic is not None and ":" not in basic:
            where = basic_auth_file or "FORQ_WEB_BASIC_AUTH"
            raise SecretError(f'basic auth from {where} must be "user:password"')
        return cls(token, basic)

    def allows(self, authorization: str | None, cookie_token: str | None) -> bool:
        if not self.enabled:
            return True
        if self.token and cookie_token and _same(cookie_token, self.token):
            return True
        if not authorization:
            return False
        scheme, _, value = authorization.partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer" and self.token:
            return _same(value.strip(), self.token)
        if scheme == "basic" and self.basic:
            try:
                given = base64.b64decode(value.strip(), validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                return False
            return _same(given, self.basic)
        return False

    def token_matches(self, given: str | None) -> bool:
        return bool(self.token and given and _same(given, self.token))


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def new_csrf_token() -> str:
    return secrets.token_urlsafe(24)


def csrf_ok(cookie: str | None, field: str | None) -> bool:
    return bool(cookie and field and len(cookie) >= 16 and _same(cookie, field))


def same_origin(origin: str | None, host: str | None) -> bool:
    """A browser's Origin header (absent from some same-site requests) names our host."""
    if not origin:
        return True
    if origin == "null" or not host:
        return False
    return urlsplit(origin).netloc.lower() == host.lower()
