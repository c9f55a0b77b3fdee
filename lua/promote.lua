--[[
  promote: run a scheduled job now (a delayed job, or a retry waiting out its backoff):
  it becomes pending as if its run-at had just come, at the tail of its priority (the
  head for a lifo job). Attempts and crashes are left as they are.

  KEYS[1]  forq:{q}:scheduled   zset (run-at ms)
  KEYS[2]  forq:{q}:pending     zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id

  Returns {"promoted", "pending"}, or {"refused", state} when the job is not scheduled
  (nothing changed), or {"missing", ""} when there is no such job.
  Publishes on forq:{q}:wake so waiting supervisors claim it at once.
  Transitions: scheduled -> pending
]]
--@include includes/time
--@include includes/job
--@include includes/history
--@include includes/wake
--@include includes/pending

local scheduled_key = KEYS[1]
local prefix, id = ARGV[1], ARGV[2]
local jkey = job_key(prefix, id)
local f = redis.call('HMGET', jkey, 'state', 'priority', 'group', 'lifo', 'run_at')
if not f[1] then return {'missing', ''} end
if f[1] ~= 'scheduled' then return {'refused', f[1]} end
local at = now_ms()
redis.call('ZREM', scheduled_key, id)
local score = pending_score(prefix, tonumber(f[2]) or 0, f[4])
redis.call('HSET', jkey, 'state', 'pending', 'score', score, 'run_at', at)
to_pending(prefix, id, score, f[3] or nil, at)
add_history(prefix, id, 'promoted', at, {was_due = tonumber(f[5])})
wake(prefix, 0)
return {'promoted', 'pending'}
