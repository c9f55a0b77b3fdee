"""The Redis key schema. Every key of one queue shares the hash tag ``{queue}`` so a
script touching them stays in one Redis Cluster slot."""

from __future__ import annotations

from dataclasses import dataclass

ROOT = "forq"
QUEUES = f"{ROOT}:queues"  # set of every queue name ever enqueued to
SUPERVISORS = f"{ROOT}:supervisors"  # hash: supervisor id -> JSON heartbeat record
SCHEDULES = f"{ROOT}:schedules"  # hash: schedule name -> JSON {"last": tick seconds, "job": id}
FORMAT = f"{ROOT}:format"  # hash: the data format in Redis (forq.store.dataformat)
# hash: schedule name -> JSON definition {cron, timezone, queue, task, next, seen}, written
# by every supervisor that runs it, so `forq schedules` and `forq web` need no config file
SCHEDULE_DEFS = f"{ROOT}:schedules:defs"
# hash: the schedules added at run time (lua/schedule_define.lua says what it holds)
SCHEDULES_RUNTIME = f"{ROOT}:schedules:runtime"


@dataclass(frozen=True)
class QueueKeys:
    """Names of one queue's keys; the Lua scripts derive job keys from `prefix`."""

    queue: str

    def __post_init__(self) -> None:
        if not self.queue or any(c in self.queue for c in "{}: \t\n"):
            raise ValueError(
                f"queue name {self.queue!r} must be non-empty without braces, colons or spaces"
            )

    @property
    def prefix(self) -> str:
        return f"{ROOT}:{{{self.queue}}}:"

    @property
    def pending(self) -> str:
        return self.prefix + "pending"

    @property
    def scheduled(self) -> str:
        return self.prefix + "scheduled"

    @property
    def active(self) -> str:
        return self.prefix + "active"

    @property
    def dead(self) -> str:
        return self.prefix + "dead"

    @property
    def finished(self) -> str:
        """Recently finished (succeeded, dead, cancelled) ids by finish time, capped."""
        return self.prefix + "finished"

    @property
    def kept(self) -> str:
        """Set of the retention buckets "<state>:<count>" (lua/trim.lua, docs/operations/retention.md)."""
        return self.prefix + "kept"

    def kept_bucket(self, bucket: str) -> str:
        """Zset of the ended jobs of a bucket, by the time their keep age runs out."""
        return f"{self.prefix}kept:{bucket}"

    def needed_by(self, job_id: str) -> str:
        """Set: the jobs that will read this ended job's record (its depends_on waiters)."""
        return f"{self.prefix}job:{job_id}:needed_by"

    @property
    def expiring(self) -> str:
        """Jobs with an expiry before start, by expire_at (ms): the reaper's sweep."""
        return self.prefix + "expiring"

    @property
    def limits(self) -> str:
        """Hash: the queue's settings every script reads: rate, max_in_flight, the group
        limits, paused, events (the events switch and cap), on_dead."""
        return self.prefix + "limits"

    @property
    def tripped(self) -> str:
        """Hash task -> JSON reason: the tasks their circuit breaker tripped
        (lua/includes/breaker.lua); claim parks their jobs."""
        return self.prefix + "tripped"

    @property
    def parked_tasks(self) -> str:
        """Set: the tasks with jobs parked (`parked`), for resume_task.lua's pass."""
        return self.prefix + "parked_tasks"

    def parked(self, task: str) -> str:
        """Zset id -> pending score: a tripped task's jobs, parked by claim."""
        return self.prefix + "parked:" + task

    @property
    def events(self) -> str:
        """The queue's event stream, capped (lua/includes/events.lua, forq.events)."""
        return self.prefix + "events"

    @property
    def bucket(self) -> str:
        return self.prefix + "bucket"

    @property
    def stats(self) -> str:
        return self.prefix + "stats"

    @property
    def wake(self) -> str:
        """Pub/sub channel: a message means "work may be claimable now or at <ms>"."""
        return self.prefix + "wake"

    def policy(self, sha: str) -> str:
        """A job policy, stored once by claim under the sha1 of its JSON (forq.store.policy)."""
        return f"{self.prefix}policy:{sha}"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def history(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}:history"

    def done(self, job_id: str) -> str:
        """Completion marker of an idempotent job, written before its ack."""
        return f"{self.prefix}done:{job_id}"

    def done_followups(self, job_id: str) -> str:
        """The same-queue follow-ups recorded with that completion (JSON list of specs),
        enqueued by claim/reclaim if the ack that carried them never landed."""
        return f"{self.prefix}done-followups:{job_id}"

    # -- groups (per-key concurrency and rate; lua/includes/groups.lua says what each holds)

    def group_pending(self, group: str) -> str:
        """One group's pending jobs (zset scored like `pending`)."""
        return f"{self.prefix}gpending:{group}"

    def group_bucket(self, group: str) -> str:
        """One group's rate-limit token bucket (hash: tokens, ts)."""
        return f"{self.prefix}gbucket:{group}"

    def group_throttle(self, group: str) -> str:
        """Until when (Redis ms) the group is throttled, expiring then."""
        return f"{self.prefix}gthrottle:{group}"

    @property
    def groups_ready(self) -> str:
        """Groups that may start a job now, by their head job's score."""
        return self.prefix + "groups:ready"

    @property
    def groups_wait(self) -> str:
        """Groups held by their rate limit, by when their next token comes (ms)."""
        return self.prefix + "groups:wait"

    @property
    def groups_running(self) -> str:
        """Hash: group -> its active jobs."""
        return self.prefix + "groups:running"

    @property
    def groups_pending(self) -> str:
        """How many grouped jobs are pending (a counter: they are not in `pending`)."""
        return self.prefix + "groups:pending"

    @property
    def waiting(self) -> str:
        """Jobs waiting on their dependencies (depends_on), by enqueue time."""
        return self.prefix + "waiting"

    @property
    def relay(self) -> str:
        """Ends of this queue's batch members whose batch lives on another queue, for the
        reaper to deliver there (zset of JSON [batch queue, batch id, member, ok])."""
        return self.prefix + "relay"

    def batch(self, batch_id: str) -> str:
        """A batch opened on this queue (hash; its sets :ended, :failed, list :members)."""
        return f"{self.prefix}batch:{batch_id}"

    def usage(self, hour: int) -> str:
        """Hash: the cost of the runs that ended in `hour` (Redis ms // 3600000), per
        group (lua/includes/cost.lua), expiring about a week after."""
        return self.prefix + f"usage:{hour}"

    def minute(self, minute: int) -> str:
        return f"{self.prefix}minute:{minute}"
