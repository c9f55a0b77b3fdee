"""Everything the supervisor says to Redis, and what it does with the answers.

Each part queues its commands on the turn's one pipeline and takes back the replies it
asked for (`roundtrip`); none opens a round trip of its own on the hot path.

| module | what it is |
| --- | --- |
| `roundtrip` | `RoundTrip`: one pipeline a loop turn for claims, steps, reports, reclaims |
| `claimer` | `Claimer`: lease jobs for the free slots (and the prefetch) |
| `reports` | `Reporter`: ack, fail, expire or release each finished child |
| `notes` | `JobNotes`: running children's progress and durable steps |
| `reaper` | `Reaper`: hand expired leases back, sweep expired jobs (every supervisor) |
| `relay` | `BatchRelay`: batch members' ends to batches on other queues |
| `scheduler` | `Scheduler`: cron ticks, each exactly once across supervisors |
| `runtime_schedules` | `RuntimeSchedules`: the schedules added at run time, reloaded on change |
| `queue_settings` | a config's queue limits and pauses, written where every supervisor reads |
| `roster` | the roster of live supervisors (`forq supervisors`, the dashboard, alerts) |
| `health` | `RedisHealth`: whether to talk to Redis now (backoff after errors) |
| `shard_health` | `ShardHealth`: the same per shard of a Redis Cluster |
| `shards` | one pipeline split by shard, and what a shard that is down answers |
| `checks` | what a Redis must be for forq's promise to hold (eviction, version) |
"""
