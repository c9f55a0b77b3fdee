"""A handler module that ends the fork server importing it (but imports anywhere else):
for the test that a fork server which cannot start leaves the supervisor starting each
job's child alone."""

import os
import sys

if sys.argv and sys.argv[0].endswith("fork/server.py"):
    os._exit(3)
