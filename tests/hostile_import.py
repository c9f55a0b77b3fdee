"""A handler module whose top-level code reports where it runs: the process, its user,
and whether it can read the Redis password (tests/test_hostile.py). Module top-level
code is handler code: it must run only in the fork server, never in the supervisor."""

import json
import os

_LOG = os.environ.get("FORQ_TEST_IMPORT_LOG")

if _LOG:
    try:
        with open(f"/proc/{os.getpid()}/environ", "rb") as f:
            environ = f.read()
    except OSError:  # not dumpable after its change of user: its /proc files are root's
        environ = b""
    with open(_LOG, "a") as log:
        log.write(json.dumps({"pid": os.getpid(), "uid": os.getuid(),
                              "password": b"FORQ_REDIS_PASSWORD=" in environ}) + "\n")

print("hostile_import loaded", flush=True)
try:  # empty whatever stderr is: the supervisor's log, if it were inherited
    os.ftruncate(2, 0)
except OSError:
    pass
