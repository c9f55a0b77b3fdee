"""A handler module that imports in the supervisor but not in its fork server: for the
test that a fork server which cannot start leaves the supervisor forking children itself."""

import sys

if sys.argv and sys.argv[0].endswith("fork/server.py"):
    raise RuntimeError("this module refuses the fork server")
