"""A handler module that takes longer to import than a lease lasts (tests/test_forkserver.py:
a fork server that starts this slowly must not cost the running jobs their leases)."""

import time

time.sleep(4.0)  # lease_ttl is 2 s in the tests' configs
