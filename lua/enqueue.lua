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
            forq:{q}:expiring; see sweep_expired.lua)}

  Returns a flat list, three entries per job in order: id, status, run_at.
    status "pending" | "scheduled" | "duplicate" (id is then the live job that holds
    the idempotency key, or the same id when that job id already exists).
  Publishes on forq:{q}:wake so waiting supervisors claim without polling.
  Transitions: [*] -> pending, [*] -> scheduled
]]
--@include _lib

local prefix, queue = ARGV[1], ARGV[2]
local at = now_ms()
local out = {}
local earliest = nil
local added = 0
for i = 3, #ARGV do
  local r = enqueue_one(prefix, queue, cjson.decode(ARGV[i]), at)
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
