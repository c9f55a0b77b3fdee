#!lua
--[[
  enqueue: create jobs in pending (due now) or scheduled (delayed).
  A flagged script (Redis 7): refused before it runs when Redis is out of memory, so
  a job is never half-written; the producer gets QueueFull.

  KEYS[1]  forq:{q}:pending     zset, score = -priority * 2^42 + seq
  KEYS[2]  forq:{q}:scheduled   zset, score = run-at (ms)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  queue name
  ARGV[3..] one JSON object per job:
           {id, task, args (JSON text), kwargs (JSON text), priority, delay_ms | run_at_ms,
            key, unique_ms, and optional per-job limits: timeout_ms, memory_limit,
            max_attempts, max_crashes, result_ttl_ms, max_result_bytes, backoff_base_ms,
            backoff_factor, backoff_max_ms, backoff_jitter, idempotent, parent,
            traceparent (W3C trace context of the producer's span), expires_in_ms |
            expire_at_ms (expiry before start: the job's `expire_at`, indexed in
            forq:{q}:expiring; see sweep_expired.lua),
            depends_on (ids of jobs of this queue, enqueued before it: it waits until
            they end), allow_failure, batch and batch_queue (its batch, see batch.lua)}

  Returns a flat list, three entries per job in order: id, status, run_at.
    status "pending" | "scheduled" | "duplicate" (id is then the live job that holds
    the idempotency key, or the same id when that job id already exists) | "waiting"
    (on its depends_on) | "dead" (a dependency had failed already).
  An error reply "forq: depends_on of job X: no job Y in queue Q" when a dependency is
  unknown: then nothing of the call was written.
  Publishes on forq:{q}:wake so waiting supervisors claim without polling.
  Transitions: [*] -> pending, [*] -> scheduled, [*] -> waiting
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  (a job with depends_on waits, unless its parents ended already: then it is released,
  or dead at once when one failed)
]]
--@include includes/time
--@include includes/counts
--@include includes/wake
--@include includes/enqueue_job
--@include includes/depends_on

local prefix, queue = ARGV[1], ARGV[2]
-- a dependency on an unknown job refuses the whole call, before anything is written
local specs, refused = decode_specs(prefix, queue, 3)
if not specs then return refused end
local at = now_ms()
local out = {}
local earliest = nil
local added = 0
for _, spec in ipairs(specs) do
  local r
  if spec['depends_on'] then r = enqueue_waiting(prefix, queue, spec, at)
  else r = enqueue_one(prefix, queue, spec, at) end
  out[#out + 1] = r[1]
  out[#out + 1] = r[2]
  out[#out + 1] = r[3] or 0
  if r[2] ~= 'duplicate' then
    local due = r[2] == 'pending' and 0 or r[3]
    if earliest == nil or due < earliest then earliest = due end
    added = added + 1
  end
end
if added > 0 then count(prefix, 'enqueued', at, added) end
if earliest ~= nil then wake(prefix, earliest) end
return out
