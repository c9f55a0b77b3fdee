"""A handler module whose top-level code sets a systemd per-service variable in the fork
server (tests/test_forkserver.py: the jobs must not see it)."""

import os

os.environ["NOTIFY_SOCKET"] = "/run/systemd/notify"
