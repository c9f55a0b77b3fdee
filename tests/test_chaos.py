"""The chaos harness: a short run under every fault kind passes, and the checker fails
when it should (a deliberately broken build is caught, and the report names why).

Both runs are real: their own redis-server (AOF, appendfsync always), supervisors as
separate processes, real signals. See chaos/run.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.checker import Checker
from chaos.faults import KINDS
from forq import Job

REPO = Path(__file__).resolve().parent.parent

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="chaos starts its own redis-server; none on PATH")


def run_chaos(tmp_path: Path, *args: str, timeout: float) -> tuple[int, dict, str]:
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "FORQ_CHAOS_BREAK"}
    proc = subprocess.run([sys.executable, "-m", "chaos", "--quiet", "--report", str(report),
                           *args], cwd=str(REPO), env=env, capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert report.exists(), f"no report written (exit {proc.returncode}):\n{out}"
    return proc.returncode, json.loads(report.read_text()), out


def invariant(result: dict, number: int) -> dict:
    return next(i for i in result["invariants"] if i["number"] == number)


@needs_redis
@pytest.mark.timeout(240)
def test_short_chaos_run_holds_every_invariant(tmp_path: Path) -> None:
    code, result, out = run_chaos(tmp_path, "--duration", "55s", "--seed", "20261129",
                                  timeout=200)
    assert code == 0, out
    assert result["ok"], out
    stats = result["stats"]
    for kind in KINDS:
        assert stats["faults"].get(kind, 0) >= 2, (kind, stats["faults"], out)
    assert stats["told"] >= 1500, out
    assert stats["lost"] == 0
    assert stats["states"].get("succeeded", 0) + stats["states"].get("dead", 0) == stats["told"]
    # the faults did something: jobs were re-run, and for a stated reason
    causes = stats["re_execution_causes"]
    assert causes.get("supervisor killed", 0) + causes.get("supervisor stopped", 0) > 0, out
    assert causes.get("child killed", 0) + causes.get("handler crash", 0) > 0, out
    assert stats["latency"]["child_crash"]["n"] > 0
    assert all(i["ok"] for i in result["invariants"])
    # the one-screen report
    assert "PASS" in out and "lost 0" in out
    assert len(out.strip().splitlines()) <= 30


@needs_redis
@pytest.mark.timeout(240)
def test_checker_catches_a_broken_build(tmp_path: Path) -> None:
    """drop-job: the producer says three jobs are enqueued and never sends them;
    double-run: an idempotent job's completion is recorded twice;
    no-fencing: a supervisor (and its fork server) keeps children whose lease is lost or
    unproven, and acks with a stale token; slow jobs longer than a stop make a stopped
    supervisor's child run on while its job runs again elsewhere. Each must be named by
    the invariant it breaks."""
    code, result, out = run_chaos(
        tmp_path, "--duration", "20s", "--seed", "7", "--rate", "30", "--slow-ms", "2500-5000",
        "--break", "drop-job,double-run,no-fencing",
        # three stops: a stopped supervisor with no child running shows nothing to fence
        "--faults", "sup_stop,child_kill", "--min-each", "3", "--settle", "20s",
        timeout=150)
    assert code == 1, out
    assert not result["ok"]
    assert "FAIL" in out
    lost = invariant(result, 1)
    assert not lost["ok"] and lost["violations"] == 3, lost
    assert all("no record in Redis" in ex for ex in lost["examples"]), lost
    assert result["stats"]["lost"] == 3
    assert "lost 3" in out
    once = invariant(result, 4)
    assert not once["ok"], once
    assert any("completed 2 times" in ex for ex in once["examples"]), once
    fencing = invariant(result, 2)["examples"] + invariant(result, 3)["examples"]
    assert any("stale ack" in ex or "after 'succeeded'" in ex or "two states" in ex
               or "both" in ex for ex in fencing), fencing
    overlap = invariant(result, 8)
    assert not overlap["ok"] and any(" ran " in ex and " into execution " in ex
                                     for ex in overlap["examples"]), overlap


# -- the checker's pieces, without processes ------------------------------------------------


def job(history: list[dict], state: str = "succeeded", **fields: str) -> Job:
    record = {"id": "j1", "queue": "chaos", "state": state, **fields}
    return Job.from_record(None, record, [json.dumps(h) for h in history])


def test_replay_accepts_a_legal_history() -> None:
    h = [{"event": "enqueued", "at": 1000},
         {"event": "claimed", "at": 1001, "owner": "h:1", "token": 5},
         {"event": "crashed", "at": 1002, "reason": "killed by SIGKILL"},
         {"event": "reclaimed", "at": 1002, "reason": "killed by SIGKILL"},
         {"event": "claimed", "at": 1003, "owner": "h:2", "token": 9},
         {"event": "retry", "at": 1004, "reason": "boom"},
         {"event": "claimed", "at": 1005, "owner": "h:2", "token": 11},
         {"event": "succeeded", "at": 1006}]
    assert Checker.replay(job(h)) == []


def test_replay_names_a_double_success_and_a_stale_claim() -> None:
    h = [{"event": "enqueued", "at": 1000},
         {"event": "claimed", "at": 1001, "owner": "h:1", "token": 5},
         {"event": "succeeded", "at": 1002},
         {"event": "succeeded", "at": 1003},
         {"event": "claimed", "at": 1004, "owner": "h:2", "token": 4}]
    problems = Checker.replay(job(h, state="succeeded"))
    assert any("'succeeded' after 'succeeded'" in p for p in problems), problems
    assert any("claimed while succeeded" in p for p in problems), problems
    assert any("token 4 not after 5" in p for p in problems), problems
    assert any("history ends active, record says succeeded" in p for p in problems), problems


def test_claims_end_at_the_next_lease_ending_event() -> None:
    h = [{"event": "enqueued", "at": 1000},
         {"event": "claimed", "at": 1001, "owner": "h:1", "token": 5},
         {"event": "reclaimed", "at": 3500, "reason": "lease expired (owner h:1)"},
         {"event": "claimed", "at": 3600, "owner": "h:2", "token": 6},
         {"event": "succeeded", "at": 3700, "source": "completion recorded before"}]
    claims = Checker.claims(job(h))
    assert [(c.owner_pid, c.end_event) for c in claims] == [(1, "reclaimed"), (2, "succeeded")]
    assert claims[0].end_at == 3.5 and claims[1].end_source == "completion recorded before"
