"""A queue's `prefetch` (supervisor/leases/held.py) with real supervisors: jobs leased ahead of
a free slot keep their leases while they wait, start in claim order the moment a slot
frees, and are given back at once — never run, no attempt counted — on a drain, a
cancel, or a reload that lowers the prefetch; a supervisor killed while holding leaves
them to a peer's reaper, and each still runs once.

`tests.wait_file` holds the queue's one slot for as long as a test needs; `tests.touch`
appends a line at every execution's start, outside Redis, so a job that never ran is
seen never to have run.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from forq import Queue
from tests.helpers import wait_for, wait_job
from tests.redis_server import free_port
from tests.supervisors import SupervisorProcess, write_config
from tests.test_supervisor_ops import sample, scrape

TERMINAL = ("succeeded", "dead", "cancelled")


def events(queue: Queue, job_id: str) -> list[str]:
    return [h["event"] for h in queue.get(job_id).history]


def started(touch: Path) -> list[str]:
    """Job ids in the order their executions started."""
    if not touch.exists():
        return []
    return [line.split()[0] for line in touch.read_text().splitlines()
            if line.endswith(" start")]


def config(tmp_path: Path, redis_url: str, queue: Queue, prefetch: int,
           metrics_port: int = 0, concurrency: int = 1, **options) -> Path:
    options.setdefault("lease_ttl", "1s")
    path = write_config(tmp_path / "forq.toml", redis_url, {queue.name: concurrency},
                        queue_extra=f"prefetch = {prefetch}\n", **options)
    if metrics_port:
        path.write_text(path.read_text().replace(
            '[metrics]\nlisten = ""', f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"'))
    return path


def hold_slot(queue: Queue, gate: Path, sup: SupervisorProcess) -> str:
    """A job that runs until `gate` exists, running: the queue's one slot is taken."""
    job = queue.enqueue("tests.wait_file", str(gate))
    wait_job(queue, job.id, ("active",), context=lambda: sup.log()[-3000:])
    return job.id


def until(predicate, message: str, sup: SupervisorProcess, timeout: float = 10.0) -> None:
    try:
        wait_for(predicate, timeout=timeout, message=message)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{sup.log()[-3000:]}") from None


def held(queue: Queue, ids: list[str], sup: SupervisorProcess) -> list[str]:
    """Wait until the supervisor leased every one of `ids`; their owners."""
    until(lambda: all(queue.get(i).state == "active" for i in ids), f"{ids} leased", sup)
    return [queue.get(i).fields["owner"] for i in ids]


def hold_two(queue: Queue, tmp_path: Path, sup: SupervisorProcess) -> tuple[str, list[str]]:
    """The slot taken by a job that waits for `tmp_path/gate`, then two `tests.touch`
    jobs (writing `tmp_path/touch`) leased and held behind it: (blocker, held ids)."""
    blocker = hold_slot(queue, tmp_path / "gate", sup)
    ids = [queue.enqueue("tests.touch", str(tmp_path / "touch")).id for _ in range(2)]
    held(queue, ids, sup)
    return blocker, ids


@pytest.mark.timeout(60)
def test_held_jobs_keep_their_leases_and_start_in_claim_order(tmp_path, redis_url, queue):
    gate, touch = tmp_path / "gate", tmp_path / "touch"
    port = free_port()
    cfg = config(tmp_path, redis_url, queue, prefetch=2, metrics_port=port)
    with SupervisorProcess(cfg).start() as sup:
        assert sample(scrape(port), "forq_jobs_held", queue=queue.name) == 0
        blocker = hold_slot(queue, gate, sup)
        ids = [queue.enqueue("tests.touch", str(touch)).id for _ in range(3)]
        owner = queue.get(blocker).fields["owner"]
        # two leased ahead of the slot, the third waits in pending: prefetch is 2
        assert held(queue, ids[:2], sup) == [owner, owner]
        assert queue.get(ids[2]).state == "pending"
        assert started(touch) == []
        body = scrape(port)
        assert sample(body, "forq_jobs_held", queue=queue.name) == 2
        assert sample(body, "forq_children_running", queue=queue.name) == 1

        # the held leases are extended like a running job's: past a whole lease_ttl (1 s)
        # after their claim, still the same lease, never reclaimed
        first = int(queue.get(ids[0]).fields["lease_deadline"])
        until(lambda: int(queue.get(ids[0]).fields["lease_deadline"]) > first + 1500,
              "the held lease extended past its first ttl", sup)
        assert queue.get(ids[1]).fields["owner"] == owner
        assert started(touch) == [] and queue.get(ids[2]).state == "pending"

        gate.touch()
        for job_id in [blocker, *ids]:
            job = wait_job(queue, job_id, TERMINAL, context=lambda: sup.log()[-3000:])
            assert job.state == "succeeded", job.history
            assert (job.attempts, job.crashes) == (1, 0)
        assert started(touch) == ids  # held ones first, in claim order
        for job_id in ids:
            assert events(queue, job_id) == ["enqueued", "claimed", "succeeded"]
        until(lambda: sample(scrape(port), "forq_jobs_held", queue=queue.name) == 0,
              "no job held once the queue is empty", sup)


@pytest.mark.timeout(60)
def test_drain_gives_held_jobs_back_at_once_and_runs_the_rest(tmp_path, redis_url, queue):
    gate, touch = tmp_path / "gate", tmp_path / "touch"
    cfg = config(tmp_path, redis_url, queue, prefetch=2, drain_timeout="30s")
    with SupervisorProcess(cfg).start() as sup:
        blocker, ids = hold_two(queue, tmp_path, sup)

        sup.signal(signal.SIGTERM)
        # back in pending while the running job still runs (its drain lasts up to 30 s)
        until(lambda: all(queue.get(i).state == "pending" for i in ids), "held jobs released",
              sup)
        assert queue.get(blocker).state == "active"
        for job_id in ids:
            job = queue.get(job_id)
            assert events(queue, job_id) == ["enqueued", "claimed", "released"]
            assert job.history[-1]["reason"] == "drain"
            assert (job.attempts, job.crashes) == (0, 0)
            assert "owner" not in job.fields

        gate.touch()
        assert sup.wait(timeout=20) == 0
        assert queue.get(blocker).state == "succeeded"
        assert started(touch) == []  # given back, never run
        assert queue.stats()["pending"] == 2 and queue.stats()["active"] == 0


@pytest.mark.timeout(60)
def test_a_cancelled_held_job_never_runs(tmp_path, redis_url, queue):
    gate, touch = tmp_path / "gate", tmp_path / "touch"
    with SupervisorProcess(config(tmp_path, redis_url, queue, prefetch=2)).start() as sup:
        blocker, ids = hold_two(queue, tmp_path, sup)
        queue.cancel(ids[0])
        # the next extension (every lease_ttl/3) hears of it and gives the job back
        job = wait_job(queue, ids[0], TERMINAL, timeout=10, context=lambda: sup.log()[-3000:])
        assert job.state == "cancelled", job.history
        assert queue.get(blocker).state == "active"

        gate.touch()
        assert wait_job(queue, ids[1], TERMINAL).state == "succeeded"
        assert started(touch) == [ids[1]]


@pytest.mark.timeout(60)
def test_a_reload_that_lowers_the_prefetch_gives_held_jobs_back(tmp_path, redis_url, queue):
    gate, touch = tmp_path / "gate", tmp_path / "touch"
    port = free_port()
    cfg = config(tmp_path, redis_url, queue, prefetch=2, metrics_port=port)
    with SupervisorProcess(cfg).start() as sup:
        blocker, ids = hold_two(queue, tmp_path, sup)

        config(tmp_path, redis_url, queue, prefetch=1, metrics_port=port)
        sup.signal(signal.SIGHUP)
        # the last claimed goes back; the first stays held
        until(lambda: queue.get(ids[1]).state == "pending", "one held job released", sup)
        assert queue.get(ids[1]).history[-1]["reason"] == (
            "prefetch lowered or queue no longer served")
        assert queue.get(ids[0]).state == "active"
        # a reload declares the queue's gauges anew, then counts what is held and running
        until(lambda: "reloaded" in sup.log(), "the reload logged", sup)
        body = scrape(port)
        assert sample(body, "forq_jobs_held", queue=queue.name) == 1
        assert sample(body, "forq_children_running", queue=queue.name) == 1

        gate.touch()
        for job_id in ids:
            assert wait_job(queue, job_id, TERMINAL).state == "succeeded"
        assert started(touch) == ids
        assert queue.get(blocker).state == "succeeded"


@pytest.mark.timeout(60)
def test_a_reload_that_adds_slots_starts_held_jobs_in_them(tmp_path, redis_url, queue):
    gate, touch = tmp_path / "gate", tmp_path / "touch"
    cfg = config(tmp_path, redis_url, queue, prefetch=2)
    with SupervisorProcess(cfg).start() as sup:
        blocker, ids = hold_two(queue, tmp_path, sup)

        config(tmp_path, redis_url, queue, prefetch=2, concurrency=3)
        sup.signal(signal.SIGHUP)
        # both run in the new slots while the first job still holds its own
        for job_id in ids:
            job = wait_job(queue, job_id, TERMINAL, timeout=10,
                           context=lambda: sup.log()[-3000:])
            assert job.state == "succeeded", job.history
        assert queue.get(blocker).state == "active"
        # two new slots start the two held jobs together: their order is a race
        assert sorted(started(touch)) == sorted(ids)
        gate.touch()
        assert wait_job(queue, blocker, TERMINAL).state == "succeeded"


@pytest.mark.timeout(90)
def test_held_leases_of_a_killed_supervisor_go_to_a_peer_and_run_once(tmp_path, redis_url,
                                                                      queue):
    gate, touch = tmp_path / "gate", tmp_path / "touch"
    cfg = config(tmp_path, redis_url, queue, prefetch=2)
    with SupervisorProcess(cfg).start() as first:
        blocker, ids = hold_two(queue, tmp_path, first)
        first.kill()
    gate.touch()  # the job the killed supervisor ran may finish now wherever it runs
    with SupervisorProcess(cfg).start() as peer:
        for job_id in [blocker, *ids]:
            job = wait_job(queue, job_id, TERMINAL, timeout=30,
                           context=lambda: peer.log()[-3000:])
            assert job.state == "succeeded", job.history
            assert "reclaimed" in events(queue, job_id)
        assert sorted(started(touch)) == sorted(ids)  # each held job ran once, on the peer


@pytest.mark.timeout(60)
def test_auto_prefetch_holds_nothing_behind_a_slot_busy_with_a_long_job(tmp_path, redis_url,
                                                                         queue):
    """prefetch = "auto" holds jobs only after a streak of short ones (`ShortJobs`): behind
    a long job, the next jobs stay in pending, free for any other supervisor. A job of a
    second queue, claimed in the same kind of loop turn, shows the claims went on."""
    from forq.testing.redis import delete_queue

    other = Queue(f"{queue.name}-b", redis=queue.redis)
    gate, touch = tmp_path / "gate", tmp_path / "touch"
    cfg = write_config(tmp_path / "forq.toml", redis_url, {queue.name: 1, other.name: 1},
                       queue_extra='prefetch = "auto"\n', lease_ttl="1s")
    try:
        with SupervisorProcess(cfg).start() as sup:
            blocker = hold_slot(queue, gate, sup)
            ids = [queue.enqueue("tests.touch", str(touch)).id for _ in range(2)]
            witness = other.enqueue("tests.touch", str(tmp_path / "other"))
            wait_job(other, witness.id, ("succeeded",), context=lambda: sup.log()[-3000:])
            assert [queue.get(i).state for i in ids] == ["pending", "pending"]
            gate.touch()
            for job_id in [blocker, *ids]:
                assert wait_job(queue, job_id, TERMINAL).state == "succeeded"
            assert started(touch) == ids
    finally:
        delete_queue(other.redis, other.name)
