"""The fork server's heap on transparent huge pages (`supervisor/fork/hugepages.py`):
said at start-up, taken where the kernel offers them, never leaking glibc's tunables
into a job, and off with `[supervisor].huge_pages = false`."""

from __future__ import annotations

import re

import pytest

from forq.supervisor.config.load import ConfigError, load_config
from forq.supervisor.fork import hugepages
from tests.helpers import wait_for
from tests.supervisors import TEST_IMPORTS, SupervisorProcess, fork_servers_of, write_config

OFFERED = hugepages.offered()
STARTED = re.compile(r"fork server started in pid (\d+) \(code .*?\): (.*)")


def _start(tmp_path, redis_url, queue, env=None, **options) -> SupervisorProcess:
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1},
                          imports=(*TEST_IMPORTS, "tests.heap_app"), drain_timeout="2s",
                          **options)
    return SupervisorProcess(config, env=env).start()


def _started_line(sup: SupervisorProcess) -> str:
    return wait_for(lambda: (m := STARTED.search(sup.log())) and m.group(2), timeout=10,
                    message="the fork server's start-up line")


def _anon_huge_kib(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


@pytest.mark.timeout(60)
def test_the_heap_goes_on_huge_pages_and_the_start_up_line_says_so(tmp_path, redis_url, queue):
    sup = _start(tmp_path, redis_url, queue,
                 env={"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    try:
        said = _started_line(sup)
        (server,) = fork_servers_of(sup.pid)
        done = queue.enqueue("tests.heap_env").wait(timeout=10)
        assert done["items"] > 0
        # the tunables were for the fork server's exec: its jobs see the environment's own
        assert done["tunables"] == "glibc.malloc.arena_max=2", done
        if OFFERED:
            assert re.fullmatch(r"\d+ of \d+ MiB of its memory on huge pages \(transparent "
                                r"huge pages: (always|madvise)\)", said), said
            huge = int(said.split()[0])
            assert huge >= 16, said  # most of the 32 MiB heap, at least
            assert _anon_huge_kib(server) > 0
        else:
            assert said.startswith("no huge pages: the kernel offers none"), said
    finally:
        sup.stop()
    assert "Traceback" not in sup.log()


@pytest.mark.timeout(60)
def test_huge_pages_false_leaves_the_heap_and_the_environment_alone(tmp_path, redis_url, queue):
    sup = _start(tmp_path, redis_url, queue, supervisor_extra="huge_pages = false")
    try:
        assert _started_line(sup) == 'huge pages off ([supervisor].huge_pages = false)'
        (server,) = fork_servers_of(sup.pid)
        assert queue.enqueue("tests.heap_env").wait(timeout=10)["tunables"] is None
        with open(f"/proc/{server}/environ", "rb") as f:
            assert b"GLIBC_TUNABLES" not in f.read()
    finally:
        sup.stop()


def test_exec_env_adds_the_tunables_and_keeps_the_environments_own(monkeypatch, tmp_path):
    setting = tmp_path / "enabled"
    monkeypatch.setattr(hugepages, "THP_ENABLED", str(setting))
    setting.write_text("always [madvise] never\n")
    env = hugepages.exec_env({"PATH": "/bin", "GLIBC_TUNABLES":
                              "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"})
    assert env["PATH"] == "/bin"
    assert env["GLIBC_TUNABLES"] == ("glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold="
                                     "33554432:glibc.malloc.hugetlb=1")
    assert hugepages.exec_env({})["GLIBC_TUNABLES"].count("=") == 2
    setting.write_text("always madvise [never]\n")
    assert hugepages.exec_env({"A": "1"}) == {"A": "1"}  # nothing to ask for
    assert hugepages.report(True, "") == (f"no huge pages: the kernel offers none "
                                          f"({setting}: never)")
    monkeypatch.setattr(hugepages, "THP_ENABLED", str(tmp_path / "absent"))
    assert hugepages.thp_mode() == "" and not hugepages.offered()


def test_huge_pages_must_be_true_or_false(tmp_path):
    path = tmp_path / "forq.toml"
    path.write_text('[supervisor]\nhuge_pages = "yes"\n[[queue]]\nname = "q"\nconcurrency = 1\n')
    with pytest.raises(ConfigError, match=r"\[supervisor\]\.huge_pages.*true or false"):
        load_config(str(path))
    path.write_text('[supervisor]\nhuge_pages = false\n[[queue]]\nname = "q"\nconcurrency = 1\n')
    assert load_config(str(path)).huge_pages is False


@pytest.mark.timeout(60)
def test_what_the_fork_server_says_of_its_pages_is_one_capped_line(tmp_path, redis_url, queue):
    config = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1},
                          imports=(*TEST_IMPORTS, "tests.hostile_pages"), drain_timeout="2s")
    sup = SupervisorProcess(config).start()
    try:
        said = _started_line(sup)
        assert said.startswith("ok?2026-01-01 ERROR"), said
        assert len(said) <= 300
        assert "\n2026-01-01 ERROR forq.supervisor: forged" not in sup.log()
    finally:
        sup.stop()
