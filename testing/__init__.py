"""forq.testing: real Redis servers and real supervisors for tests.

* `forq.testing.redis` — `RedisServer` (a private redis-server on a free port),
  `python -m forq.testing.redis -- CMD` (run CMD with a reachable FORQ_REDIS_URL);
* `forq.testing.supervisor` — `write_config`, `SupervisorProcess` (`forq run` as a
  real process), `children_of` its job children;
* `forq.testing.waiting` — `wait_for` a condition, `wait_job` for a job's state;
* `forq.testing.demos` — what `make demo` and `make web` share: `say` (bold only on a
  terminal), and `stop_all` on SIGTERM as on Ctrl-C (`signals_stop`);
* `forq.testing.pytest_plugin` — fixtures for applications' own tests
  (``pytest_plugins = ["forq.testing.pytest_plugin"]``).

forq's own tests, its chaos harness and its benchmarks use the same pieces.
"""
