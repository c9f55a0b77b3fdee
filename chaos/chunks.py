"""The chunked kind: bursts of `chaos.chunked` jobs (`task(chunk=8)`), and what the
checker reads of their chunks.

The producer enqueues them in bursts (one `enqueue_many` call), so that a claim finds
several pending at once and the supervisor puts them in chunks. The handler
(`chaos.handlers.chunked`) records each job's execution like any other (start and end
lines, its result naming the execution) and one more line per chunk, listing its jobs
in order with the chunk's pid and supervisor. From those lines the checker knows:

* which executions shared a process: an execution left without an end in a chunk
  whose other job crashed it (`os._exit`) ended with its chunk (`CRASHED_WITH_CHUNK`,
  the job's own cause, as a crash is a crashy job's own);
* which jobs were in a chunk that crashed or was killed before reaching them: their
  lease ended in a crash with no execution of their own, each counted as a crash
  (docs/guide/chunks.md: "a crash takes the unreported rest with it"), which may
  exhaust a job's max_crashes without a fault of its own;
* which chunk a `child_kill` hit (the fault names the chunk's first job and pid).
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TASK = "chaos.chunked"
CRASHED_WITH_CHUNK = "crashed with its chunk"


def build_burst(rng: random.Random, seq: int, other_queue: str) -> list[dict[str, Any]]:
    """3-12 chunked jobs enqueued together: each sleeps 2-40 ms (in 1 burst of 6, 100-400
    ms: a chunk that outlives a lease, so that supervisor and Redis faults find chunks
    running, and fence them); about 1 in 5 fails its
    first 1 or 2 attempts, 1 in 12 puts itself off once (a `Retry` of 20-200 ms), 1 in
    25 exits its chunk's process on its first run, 1 in 25 fails for good
    (NonRetryable); in a third of the bursts the chunk reports its
    successes by its return value (`ret`, read from a chunk's first job). Half of the
    bursts go to `other_queue`, whose jobs are mostly chunked: its claims stay wide and
    its chunks fill; on the main queue they are claimed among other tasks' jobs (a claim
    widens only after one that leased a chunked job), so many run as chunks of one."""
    ret = rng.random() < 1 / 3
    queue = other_queue if rng.random() < 0.5 else ""
    ms = (100, 400) if rng.random() < 1 / 6 else (2, 40)
    jobs = []
    for k in range(rng.randint(3, 12)):
        kwargs: dict[str, Any] = {"ms": round(rng.uniform(*ms), 1)}
        expect = "succeed"
        if ret:
            kwargs["ret"] = True
        roll = rng.random()
        if roll < 0.04:
            kwargs["fatal"] = True
            expect = "dead:fatal"
        elif roll < 0.08:
            kwargs["crash_times"] = 1
        elif roll < 0.28:
            kwargs["fail_times"] = rng.choice([1, 2])
        elif roll < 0.36:
            kwargs["snooze_ms"] = round(rng.uniform(20, 200))
        item = {"task": TASK, "kwargs": kwargs, "job_id": f"j{seq:06d}-chunked-{k + 1}"}
        jobs.append({"item": item, "kind": "chunked", "expect": expect, "idem": False,
                     **({"queue": queue} if queue else {})})
    return jobs


@dataclass
class Chunk:
    cid: str
    jobs: list[str]
    pid: int
    spid: int
    sup: str
    t: float
    execs: list[Any] = field(default_factory=list)  # chaos.checker.Exec, by start
    kill: dict[str, Any] | None = None  # the child_kill fault that hit it

    @property
    def crashed(self) -> bool:
        """Its handler exited the process (a job's `crash_times`)."""
        return any(e.outcome == "crash" for e in self.execs)


class ChunkLog:
    """Every chunk the handlers recorded, and the executions of each."""

    def __init__(self, chunks: dict[str, Chunk]) -> None:
        self.chunks = chunks
        self.by_job: dict[str, list[Chunk]] = defaultdict(list)
        for chunk in sorted(chunks.values(), key=lambda c: c.t):
            for jid in chunk.jobs:
                self.by_job[jid].append(chunk)

    @classmethod
    def load(cls, path: Path, execs: dict[str, Any], kills: list[dict[str, Any]]) -> ChunkLog:
        """The chunk lines of the execution log; `execs` (by id) are attached to their
        chunk, and each chunked `child_kill` fault (`kills`) to the chunk it hit."""
        chunks: dict[str, Chunk] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if '"chunk"' not in line:  # a chunk's line, or one of its job's
                    continue
                try:
                    rec = json.loads(line)
                    if rec.get("ev") != "chunk":
                        continue
                    chunks[rec["chunk"]] = Chunk(rec["chunk"], list(rec["jobs"]), int(rec["pid"]),
                                                 int(rec["spid"]), rec.get("sup", ""),
                                                 float(rec["t"]))
                except (ValueError, KeyError, TypeError):
                    continue  # load_execs names a line that is not JSON
        for e in sorted(execs.values(), key=lambda e: e.start):
            if e.chunk in chunks:
                chunks[e.chunk].execs.append(e)
        log = cls(chunks)
        for f in kills:
            hit = log.hit_by(f)
            if hit is not None:
                hit.kill = f
        return log

    def hit_by(self, f: dict[str, Any]) -> Chunk | None:
        """The chunk a `child_kill` of a chunk's process hit: the last one started before
        the kill whose first job is the fault's job, in the killed pid (or PID 1, a job
        in namespaces of its own)."""
        hits = [c for c in self.by_job.get(f.get("job", ""), ()) if c.jobs[0] == f["job"]
                and c.pid in (f.get("pid"), 1) and c.t <= f["t"]]
        return hits[-1] if hits else None

    def of(self, e: Any) -> Chunk | None:
        return self.chunks.get(e.chunk) if e.chunk else None

    def killed(self, e: Any) -> bool:
        """This chunk execution was running when chaos killed its chunk's process."""
        chunk = self.of(e)
        return (chunk is not None and chunk.kill is not None and e.outcome is None
                and e.start <= chunk.kill["t"])

    def crashed_with(self, e: Any) -> bool:
        """This execution had not ended when another job of its chunk exited the process."""
        chunk = self.of(e)
        return chunk is not None and e.outcome is None and chunk.crashed

    def bystander(self, jid: str, owner_pid: int, t0: float, t1: float,
                  fault_causes: tuple[str, ...]) -> bool:
        """A lease of `jid` (held by `owner_pid` from t0 to t1) that ended in a crash with
        no execution of its own: it was in a chunk of that lease that crashed, was killed
        by chaos, or lost its process to a fault, before reaching it."""
        return any(c.spid == owner_pid and t0 <= c.t <= t1 + 0.5
                   and (c.crashed or c.kill is not None
                        or any(e.cause in fault_causes for e in c.execs))
                   for c in self.by_job.get(jid, ()))

    def stats(self) -> dict[str, Any]:
        sizes = [len(c.jobs) for c in self.chunks.values()]
        return {"chunks": len(sizes), "jobs": sum(sizes), "largest": max(sizes, default=0),
                "mean": round(sum(sizes) / len(sizes), 2) if sizes else 0.0,
                "of_one": sizes.count(1),
                "executions": sum(len(c.execs) for c in self.chunks.values()),
                "crashed": sum(1 for c in self.chunks.values() if c.crashed),
                "killed": sum(1 for c in self.chunks.values() if c.kill is not None),
                # how the chunked jobs' executions ended (the checker's end causes)
                "end_causes": dict(Counter(e.cause for c in self.chunks.values()
                                           for e in c.execs).most_common())}
