"""The systemd notify protocol, spoken directly over a unix datagram socket.

Why not libsystemd / python-systemd: the protocol is one ``sendto()`` of
newline-separated ``KEY=VALUE`` lines to the socket named by
``$NOTIFY_SOCKET``; a C dependency (and its wheels) buys nothing. See
sd_notify(3).

Why it never raises: systemd notification is advisory. A supervisor that
crashes because the notify socket went away (systemd restarted, unit run by
hand with a stale env var) would turn a cosmetic problem into an outage, so
send errors are logged at debug level and swallowed.

Why :func:`scrub_child_env`: the notify socket, watchdog and socket
activation variables describe *the supervisor's* relationship with systemd.
A job handler (or anything it spawns) that inherits them could send
``READY=1``/``STOPPING=1``/``WATCHDOG=1`` on the supervisor's behalf or claim
its listening fds. With ``NotifyAccess=main`` systemd would ignore a child's
messages anyway, but we remove them so children never even try.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping, MutableMapping

__all__ = [
    "SYSTEMD_ENV_VARS",
    "Notifier",
    "scrub_child_env",
    "watchdog_interval",
]

log = logging.getLogger(__name__)

#: Environment variables that bind a process to its systemd unit. Children
#: must never see them (see :func:`scrub_child_env`).
SYSTEMD_ENV_VARS: tuple[str, ...] = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
)


def _socket_address(path: str) -> str | bytes:
    """Translate ``$NOTIFY_SOCKET`` into an address ``sendto`` accepts.

    A leading ``@`` denotes a Linux abstract-namespace socket, whose real
    name starts with a NUL byte (that is how systemd and sd_notify(3) spell
    it in the environment, since env vars cannot hold NULs).
    """
    if path.startswith("@"):
        return b"\0" + path[1:].encode()
    return path


class Notifier:
    """Send sd_notify messages to systemd; a silent no-op outside systemd.

    Build one with :meth:`from_env` (or ``Notifier()``, which does the same)
    at startup, *before* scrubbing the environment for children. The socket
    is created lazily on the first send and kept open, so a notify costs one
    syscall; it is marked close-on-exec and the fork-per-job child closes
    every inherited fd anyway.
    """

    def __init__(self, socket_path: str | None = None, *, from_env: bool = True) -> None:
        """Use ``socket_path``, or ``$NOTIFY_SOCKET`` when it is None and ``from_env``.

        An empty or unset path makes every method a no-op, which is what a
        supervisor run from a terminal or under another init wants.
        """
        if socket_path is None and from_env:
            socket_path = os.environ.get("NOTIFY_SOCKET")
        self._path: str | None = socket_path or None
        self._address: str | bytes | None = (
            _socket_address(self._path) if self._path else None
        )
        self._sock: socket.socket | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """Build a notifier from ``environ`` (default ``os.environ``)."""
        env = os.environ if environ is None else environ
        return cls(env.get("NOTIFY_SOCKET") or None, from_env=False)

    @property
    def enabled(self) -> bool:
        """True when there is a notify socket to talk to."""
        return self._address is not None

    @property
    def socket_path(self) -> str | None:
        """The notify socket as given (``@name`` for abstract sockets)."""
        return self._path

    def send(self, message: str) -> bool:
        """Send one raw notify datagram; return whether it was handed to the kernel.

        Never raises: notification is advisory, and the supervisor must keep
        running its children even if systemd cannot hear it.
        """
        if self._address is None:
            return False
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # A full receive queue must not stall the event loop.
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(message.encode("utf-8", "replace"), self._address)
            return True
        except OSError as exc:
            log.debug("sd_notify to %r failed: %s (message %r)", self._path, exc, message)
            self._reset()
            return False

    def notify(self, **fields: object) -> bool:
        """Send ``KEY=VALUE`` fields in one datagram, e.g. ``notify(READY=1, STATUS="up")``.

        Keys are sent upper-cased in the given order. Newlines inside values
        are replaced by spaces because the protocol is line based and an
        embedded newline would inject a second (unintended) field.
        """
        if not fields:
            return False
        lines = []
        for key, value in fields.items():
            text = str(value).replace("\r", " ").replace("\n", " ")
            lines.append(f"{key.upper()}={text}")
        return self.send("\n".join(lines))

    def ready(self, status: str | None = None) -> bool:
        """Tell systemd start-up is complete (``Type=notify`` units wait for this)."""
        if status is None:
            return self.notify(READY=1)
        return self.notify(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        """Set the free-form status line shown by ``systemctl status``."""
        return self.notify(STATUS=text)

    def watchdog(self) -> bool:
        """Pet the watchdog; call every :func:`watchdog_interval` seconds from the loop.

        Sending it from the event loop (not a thread) is the point: a loop
        that is wedged stops petting and systemd restarts the supervisor.
        """
        return self.notify(WATCHDOG=1)

    def stopping(self, status: str | None = None) -> bool:
        """Tell systemd a graceful drain has begun."""
        if status is None:
            return self.notify(STOPPING=1)
        return self.notify(STOPPING=1, STATUS=status)

    def reloading(self) -> bool:
        """Tell systemd a configuration reload has begun (end it with :meth:`ready`).

        MONOTONIC_USEC (CLOCK_MONOTONIC, as systemd reads it) lets systemd ≥ 253 tell
        this reload from an earlier one; older versions ignore it."""
        return self.notify(RELOADING=1, MONOTONIC_USEC=time.monotonic_ns() // 1000)

    def mainpid(self, pid: int | None = None) -> bool:
        """Tell systemd which pid is the main process (default: this one)."""
        return self.notify(MAINPID=os.getpid() if pid is None else pid)

    def _reset(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:  # pragma: no cover - close on a dgram socket does not fail
                pass
            self._sock = None

    def close(self) -> None:
        """Close the notify socket (it is reopened on the next send)."""
        self._reset()

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Notifier(socket_path={self._path!r})"


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings, or None when no watchdog is armed.

    Half of ``$WATCHDOG_USEC`` as sd_watchdog_enabled(3) recommends, so one
    late tick does not get the supervisor killed. When ``$WATCHDOG_PID`` is
    set and is not our pid, the watchdog belongs to another process (the
    variables leaked through an exec) and we must not ping it.
    """
    env = os.environ if environ is None else environ
    raw = env.get("WATCHDOG_USEC")
    if not raw:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            log.debug("ignoring malformed WATCHDOG_PID=%r", pid)
            return None
    try:
        usec = int(raw)
    except ValueError:
        log.debug("ignoring malformed WATCHDOG_USEC=%r", raw)
        return None
    if usec <= 0:
        return None
    return usec / 1_000_000 / 2


def scrub_child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return a copy of ``env`` (default ``os.environ``) without the systemd variables.

    The result is what a forked job child should run with: it can never
    notify systemd, pet the supervisor's watchdog or grab socket-activated
    fds. The input is not modified.
    """
    source = os.environ if env is None else env
    return {k: v for k, v in source.items() if k not in SYSTEMD_ENV_VARS}


def scrub_environ(environ: MutableMapping[str, str] | None = None) -> None:
    """Remove the systemd variables from ``environ`` (default ``os.environ``) in place.

    For the child side of a fork, right after ``fork()`` and before the
    handler runs, so even ``os.environ`` lookups inside the handler and any
    subprocess it spawns see a clean environment.
    """
    target = os.environ if environ is None else environ
    for name in SYSTEMD_ENV_VARS:
        target.pop(name, None)
