"""`forq web`: serve the dashboard with uvicorn until SIGINT/SIGTERM."""

from __future__ import annotations

import ipaddress
import sys

import redis
import uvicorn

from forq.web.app import Dashboard
from forq.web.security import Auth


def parse_listen(text: str) -> tuple[str, int]:
    """"127.0.0.1:8080", "[::1]:8080" or ":8080" (loopback); ValueError says what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError(f'--listen: expected HOST:PORT, e.g. "127.0.0.1:8080", got {text!r}')
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen: port must be 1-65535, got {port!r}")
    return host, int(port)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve(client: redis.Redis, listen: str, *, read_only: bool, auth: Auth,
          refresh: float = 1.0, colors: bool = False) -> int:
    """Serve until SIGINT/SIGTERM; `colors`: uvicorn's log lines may carry colour codes
    (the CLI says so only for a terminal without NO_COLOR)."""
    host, port = parse_listen(listen)
    if not _is_loopback(host) and not auth.enabled:
        print(f"forq web: warning: listening on {host} with no auth: anyone who reaches "
              "this port can see every job's arguments"
              + ("" if read_only else " and act on them (set FORQ_WEB_TOKEN or use "
                 "--read-only)"), file=sys.stderr)
    app = Dashboard(client, read_only=read_only, auth=auth, refresh=refresh).app()
    mode = ", read-only" if read_only else ""
    mode += ", auth on" if auth.enabled else ""
    shown = f"[{host}]" if ":" in host else host
    print(f"forq web: http://{shown}:{port}/ ({mode.lstrip(', ') or 'actions on'})",
          flush=True)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=2,
                            lifespan="off", use_colors=colors)
    uvicorn.Server(config).run()
    return 0
