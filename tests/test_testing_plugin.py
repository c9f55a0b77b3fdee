"""forq.testing's pytest plugin, used as an application would: a sample project with a
handler module and a test, run by a real pytest against a real Redis and supervisor."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

SAMPLE_TASKS = '''
from forq import task

@task("sample.double")
def double(n):
    return 2 * n

@task("sample.fail")
def fail():
    raise ValueError("no")
'''

SAMPLE_TEST = '''
import pytest

def test_double(forq_worker):
    queue = forq_worker(imports=["sampleapp.tasks"])
    assert queue.enqueue("sample.double", 21).wait(timeout=30) == 42

def test_a_failure_is_dead(forq_worker):
    from forq import JobFailed
    queue = forq_worker(imports=["sampleapp.tasks"], max_attempts=1)
    with pytest.raises(JobFailed):
        queue.enqueue("sample.fail").wait(timeout=30)

def test_the_queue_alone(forq_queue):
    job = forq_queue.enqueue("sample.double", 1)
    assert forq_queue.get(job.id).state == "pending"
'''


def test_a_sample_project_tests_its_handlers_with_the_plugin(tmp_path, redis_url):
    (tmp_path / "sampleapp").mkdir()
    (tmp_path / "sampleapp" / "__init__.py").write_text("")
    (tmp_path / "sampleapp" / "tasks.py").write_text(textwrap.dedent(SAMPLE_TASKS))
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["forq.testing.pytest_plugin"]\n')
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(SAMPLE_TEST))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["FORQ_REDIS_URL"] = redis_url
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout, proc.stdout


def test_a_started_supervisor_used_as_a_context_manager_is_one_and_stops(tmp_path, redis_url):
    """`with SupervisorProcess(config).start() as sup` runs one supervisor, not two, and
    none is left once the block ends (a second start used to leak the first)."""
    import psutil

    from forq.testing.supervisor import SupervisorProcess, write_config
    from tests.helpers import gone

    config = write_config(tmp_path / "forq.toml", redis_url, {"harness-once": 1},
                          imports=("forq.examples",))
    me = psutil.Process()  # its children(): one that ends meanwhile is skipped, not raised
    before = {p.pid for p in me.children()}
    with SupervisorProcess(config).start() as sup:
        ours = {p.pid for p in me.children()} - before
        assert ours == {sup.pid}
    assert gone(sup.pid)
