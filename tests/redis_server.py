"""The tests' Redis: `forq.testing.redis` (``python -m tests.redis_server -- CMD`` is
``python -m forq.testing.redis -- CMD``)."""

from __future__ import annotations

import sys

from forq.testing.redis import DEFAULT_TEST_URL, RedisServer, free_port, main, reachable

__all__ = ["DEFAULT_TEST_URL", "RedisServer", "free_port", "reachable"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
