"""[sandbox] for untrusted handlers: another user, a scrubbed environment, fewer fds —
and the limits every child gets (no core dumps, an address-space backstop, first in
line for the OOM killer)."""

from __future__ import annotations

import os
import pwd

import pytest

from forq import Queue
from tests.supervisors import SupervisorProcess, write_config


@pytest.mark.timeout(60)
def test_every_child_gets_core_limit_backstop_and_oom_score(tmp_path, redis_url, queue: Queue):
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1})
    with SupervisorProcess(config, env={"FORQ_TEST_SECRET": "s3cret"}):
        seen = queue.enqueue("tests.whoami", memory_limit="64MiB").wait(timeout=20)
    assert seen["core"] == 0
    assert seen["as"] == 4 * 64 * 1024 * 1024  # address_space_factor 4 × memory_limit
    assert seen["oom_score_adj"] > 0
    assert "FORQ_TEST_SECRET" in seen["env"]  # no [sandbox]: the environment is kept


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="run_as needs root to change user")
def test_sandbox_runs_as_another_user_with_a_scrubbed_environment(tmp_path, redis_url,
                                                                   queue: Queue):
    nobody = pwd.getpwnam("nobody")
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1}, extra="""
[sandbox]
run_as = "nobody"
env_allow = ["PATH", "LANG"]
max_open_files = 64
""")
    with SupervisorProcess(config, env={"FORQ_TEST_SECRET": "s3cret", "LANG": "C.UTF-8"}):
        seen = queue.enqueue("tests.whoami").wait(timeout=20)
    assert (seen["uid"], seen["gid"]) == (nobody.pw_uid, nobody.pw_gid)
    assert "FORQ_TEST_SECRET" not in seen["env"]
    assert set(seen["env"]) <= {"PATH", "LANG", "HOME", "USER", "LOGNAME"}
    assert "LANG" in seen["env"]
    assert seen["nofile"] == 64
