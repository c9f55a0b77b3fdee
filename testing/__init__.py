"""forq.testing: start Redis servers and supervisors for tests, chaos runs and benchmarks."""
