"""HeldLeases: jobs leased ahead of a free slot, a queue's `prefetch`.

Why: at high rates a slot whose child has ended waits for a claim's round trip and the
claim script before its next fork. With its next job already leased, the slot starts
that job's child in the loop turn that saw the end, and the claim that tops the
prefetch up rides in the same round trip as the finished job's ack (Dramatiq and
Celery prefetch for the same reason). A `[[queue]]`'s `prefetch` is "auto" by default:
jobs held only while the queue's jobs are short (`ShortJobs`); `prefetch = N` holds N
whatever the jobs, 0 none.

A held lease is a lease like a running job's: it is in the `LeaseKeeper`, extended with
the others, and fenced the same way — a held job whose lease is no longer proven is not
started but given back. What holding costs (docs/operations/supervisor.md, "Prefetch"): a held job
waits for this machine's slot even while another supervisor is idle, so prefetch suits
short jobs; it counts against `max_in_flight` and `group_concurrency` like a running
job; a job enqueued later with a higher priority starts after the held ones; and a
supervisor killed while holding leaves those leases to the reaper, like its running
children (each counted as a crash). Drain, a reload that lowers the prefetch or stops
serving the queue, and a cancel give held jobs back at once (`release`: no attempt is
counted; a cancelled job ends as cancelled).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Collection, Iterable

from forq.queue import Lease
from forq.supervisor.leases.keeper import LeaseKeeper


class HeldLeases:
    def __init__(self, leases: LeaseKeeper,
                 on_change: Callable[[str, int], None] = lambda _queue, _count: None) -> None:
        self.leases = leases
        self.on_change = on_change  # (queue, jobs it holds now): the metrics gauge
        self._held: dict[str, deque[Lease]] = defaultdict(deque)  # by queue, claim order

    def count(self, queue: str) -> int:
        return len(self._held[queue])

    def ids(self) -> list[str]:
        """Every held job's id (the heartbeat lists them: the dashboard shows them held)."""
        return [lease.job.id for held in self._held.values() for lease in held]

    def hold(self, queue: str, lease: Lease, sent_at: float) -> None:
        """Keep a lease claimed by a call sent at `sent_at` (monotonic) for a later slot."""
        self._held[queue].append(lease)
        self.leases.add(queue, lease.job.id, lease.token, sent_at)
        self.on_change(queue, len(self._held[queue]))

    def every(self) -> list[Lease]:
        """Every held lease, of every queue."""
        return [lease for held in self._held.values() for lease in held]

    def next(self, queue: str, fits: Callable[[Lease], bool] | None = None) -> Lease | None:
        """The queue's longest-held lease (the longest-held that `fits`: a job too big
        for the memory budget now does not stop the smaller ones behind it), no longer
        held here."""
        held = self._held.get(queue)
        if not held:
            return None
        found = held[0] if fits is None else next((x for x in held if fits(x)), None)
        if found is None:
            return None
        held.remove(found)
        self.on_change(queue, len(held))
        return found

    def more_of(self, queue: str, first: Lease, chunk_of: Callable[[str], int]) -> list[Lease]:
        """The rest of a chunk whose `first` job was just taken (`children.chunks`): up
        to `chunk_of(task)` - 1 more held jobs of its task, the longest-held first, no
        longer held here."""
        task = first.job.task
        count = chunk_of(task) - 1
        if count <= 0:
            return []
        ids = [lease.job.id for lease in self._held.get(queue, ()) if lease.job.task == task]
        return [lease for _queue, lease in self.take(ids[:count])]

    def proven_since(self, lease: Lease) -> float | None:
        """When the extension that last proved this lease was sent (monotonic), the
        `sent_at` its child starts with; None once the `Fencer` gave it up unproven."""
        until = self.leases.proven_until(lease.job.id)
        if until is None or self.leases.token(lease.job.id) != lease.token:
            return None
        return until - self.leases.ttl

    def take(self, job_ids: Collection[str]) -> list[tuple[str, Lease]]:
        """Stop holding these jobs (a cancel, a lost lease); returns (queue, lease) of
        each that was held."""
        taken: list[tuple[str, Lease]] = []
        if not job_ids:  # every extension asks, nearly always about nothing
            return taken
        for queue, held in self._held.items():
            keep = deque(lease for lease in held if lease.job.id not in job_ids)
            if len(keep) != len(held):
                taken += [(queue, lease) for lease in held if lease.job.id in job_ids]
                self._held[queue] = keep
                self.on_change(queue, len(keep))
        return taken

    def trim(self, allowed: Callable[[str], int]) -> list[tuple[str, Lease]]:
        """Hold at most `allowed(queue)` per queue (0 for a queue no longer served):
        returns the (queue, lease) let go, the last claimed first."""
        taken: list[tuple[str, Lease]] = []
        for queue, held in self._held.items():
            excess = len(held) - max(0, allowed(queue))
            if excess > 0:
                taken += [(queue, held.pop()) for _ in range(excess)]
                self.on_change(queue, len(held))
        return taken


# prefetch = "auto": hold AUTO_PREFETCH jobs while the last AUTO_STREAK jobs of the queue
# each ran at most AUTO_SHORT (seconds, fork to exit), none otherwise
AUTO_PREFETCH = 4
AUTO_STREAK = 16
AUTO_SHORT = 0.010


class ShortJobs:
    """`prefetch = "auto"`: a queue holds jobs ahead of its slots only while its jobs are
    short. A held job waits for the job running in its slot to end, while another
    supervisor may be idle: behind a job of 300 ms, up to 300 ms more for a job that
    could have started at once elsewhere (`python -m bench.prefetch`). It saves a
    claim's round trip per job, which matters only when jobs last a few milliseconds.
    So jobs are held only after AUTO_STREAK jobs in a row that ran at most AUTO_SHORT
    each: the wait they add is bounded by that, and a queue of longer jobs, or of a mix
    (one long job in a streak ends it), is never held behind a busy slot."""

    def __init__(self) -> None:
        self.auto: set[str] = set()  # queues with prefetch = "auto"
        self.streak: dict[str, int] = defaultdict(int)  # short jobs in a row, by queue

    def configure(self, auto: Iterable[str]) -> None:
        self.auto = set(auto)

    def ended(self, queue: str, ran_for: float) -> None:
        """A child of the queue ended after `ran_for` seconds (fork to exit)."""
        self.streak[queue] = self.streak[queue] + 1 if ran_for <= AUTO_SHORT else 0

    def prefetch(self, queue: str, configured: int) -> int:
        """How many jobs the queue may hold now."""
        if queue not in self.auto or self.streak[queue] >= AUTO_STREAK:
            return configured
        return 0
