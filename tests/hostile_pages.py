"""A hostile handler module: it replaces what the fork server says of its huge pages
with a forged log line and a flood (the supervisor must log one capped, printable line)."""

from forq.supervisor.fork import hugepages

hugepages.report = lambda *_a, **_k: "ok\n2026-01-01 ERROR forq.supervisor: forged" + "A" * 5000
