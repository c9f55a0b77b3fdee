"""A rolling upgrade: the previous version of forq and this one on the same Redis, jobs
flowing both ways, each version running its own scripts (EVALSHA of its own text).

"The previous version" is the commit before the one that added forq.dataformat (now
forq.store.dataformat), taken from git (`git archive`) and staged in forq's installed
layout (pyproject.toml's package-dir, tests/layout.py): what a machine not yet upgraded
runs.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from forq import Queue
from forq.store.connection import connect
from forq.store.scripts import expand, source
from tests.layout import folders
from tests.redis_server import RedisServer
from tests.supervisors import REPO, SupervisorProcess, write_config

PROBE = """
import json, sys
from forq import Queue
from forq.connection import connect  # the previous version's name for it
q = Queue(sys.argv[2], redis=connect(sys.argv[1]))
job = q.enqueue("examples.add", 20, 22)
print(json.dumps({"file": __import__("forq").__file__, "result": job.wait(timeout=60)}))
"""


def previous_version(dest: Path) -> str:
    """Stage the commit before forq.dataformat in `dest`; returns its id (or skips)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git history of this checkout")
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                            "jobs/dataformat.py"], cwd=REPO, capture_output=True, text=True)
    commits = added.stdout.split()
    if added.returncode or not commits:
        pytest.skip("forq.dataformat is not committed yet: no previous version to run")
    archive = subprocess.run(["git", "archive", "--format=tar", f"{commits[-1]}^"], cwd=REPO,
                             capture_output=True)
    if archive.returncode:
        pytest.skip(f"no parent commit in this clone: {archive.stderr.decode()[:200]}")
    tree = dest / "tree"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    for target, folder in folders().items():
        if (tree / folder).is_dir():
            shutil.copytree(tree / folder, dest / "site" / target, dirs_exist_ok=True)
    return f"{commits[-1]}^"


@pytest.mark.timeout(180)
def test_the_previous_version_and_this_one_share_a_redis(tmp_path):
    old = tmp_path / "old"
    previous_version(old)
    site = old / "site"
    assert not (site / "forq" / "dataformat.py").exists()  # really the version before
    env = {"PYTHONPATH": str(site)}  # the old forq before this checkout's on the path
    with RedisServer() as server:
        r = connect(server.url)
        config_old = write_config(tmp_path / "old.toml", server.url, {"to-old": 1},
                                  imports=("forq.examples",), keep_history=None)
        config_new = write_config(tmp_path / "new.toml", server.url, {"to-new": 1},
                                  imports=("forq.examples",))
        old_sup = SupervisorProcess(config_old, command=[sys.executable, "-m",
                                                         "forq.supervisor.cli"])
        old_sup.env = dict(old_sup.env, **env)  # after the harness set its own PYTHONPATH
        with old_sup, SupervisorProcess(config_new) as new_sup:
            # this version's producer → the old supervisor
            assert Queue("to-old", redis=r).enqueue("examples.add", 1, 2).wait(timeout=60) == 3
            # the old version's producer → this supervisor
            probe = subprocess.run([sys.executable, "-c", PROBE, server.url, "to-new"],
                                   capture_output=True, text=True, timeout=90, cwd=str(tmp_path),
                                   env=dict(os.environ, **env))
            assert probe.returncode == 0, probe.stderr
            assert str(site) in probe.stdout and '"result": 42' in probe.stdout, probe.stdout
            for sup in (old_sup, new_sup):
                assert "Traceback" not in sup.log(), sup.log()
        # each version called its own scripts: where their texts differ, both are loaded,
        # each under the SHA1 of its own text; where they are the same, they are shared
        lua = old / "tree" / "lua"
        for name in ("enqueue", "claim", "ack"):
            theirs_text = expand(name, lambda path: (lua / f"{path}.lua").read_text())
            ours = r.register_script(source(name)).sha
            theirs = r.register_script(theirs_text).sha
            assert (ours == theirs) == (theirs_text == source(name))
            assert r.script_exists(ours, theirs) == [True, True], name
