--[[
  reschedule: give a waiting-to-run job a new run-at. A scheduled job gets the new time
  (a time not in the future makes it pending now, as promote does); a pending job leaves
  its place and waits in scheduled until then (a time not in the future leaves it where
  it is). Refused when the job's expiry before start (expires_in / expire_at) comes
  first: it could never run.

  KEYS[1]  forq:{q}:scheduled   zset (run-at ms)
  KEYS[2]  forq:{q}:pending     zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  the new run-at: Unix ms, or with ARGV[4] "in", ms from now (Redis's clock)
  ARGV[4]  "at" or "in"

  An error reply "forq: run-at must be ..." when ARGV[3] is not a number (nothing changed).
  Returns {"rescheduled", state, run_at} (state "scheduled" or "pending"), or
  {"refused", state, why} when nothing changed: why is "state" (not pending or
  scheduled) or "expires" (the job's expire_at is not after the new run-at), or
  {"missing", ""} when there is no such job.
  Publishes the new run-at on forq:{q}:wake, so a supervisor sleeping until a later
  due time claims it in time.
  Transitions: scheduled -> scheduled, pending -> scheduled, scheduled -> pending
]]
--@include includes/time
--@include includes/job
--@include includes/history
--@include includes/wake
--@include includes/groups
--@include includes/pending

local scheduled_key, pending_key = KEYS[1], KEYS[2]
local prefix, id = ARGV[1], ARGV[2]
local at = now_ms()
local run_at = tonumber(ARGV[3])
if not run_at or run_at ~= run_at or math.abs(run_at) > 2^53 then
  return redis.error_reply('forq: run-at must be a number of ms, got ' .. tostring(ARGV[3]))
end
if ARGV[4] == 'in' then run_at = at + run_at end
local jkey = job_key(prefix, id)
local f = redis.call('HMGET', jkey, 'state', 'priority', 'group', 'lifo', 'run_at',
  'expire_at', 'started_at')
local state = f[1]
if not state then return {'missing', ''} end
if state ~= 'scheduled' and state ~= 'pending' then return {'refused', state, 'state'} end
local expire_at = tonumber(f[6])
if expire_at and not f[7] and expire_at <= run_at then return {'refused', state, 'expires'} end
local was_due = tonumber(f[5])
if run_at <= at then
  if state == 'pending' then
    return {'rescheduled', 'pending', tonumber(f[5]) or at}
  end
  redis.call('ZREM', scheduled_key, id)
  local score = pending_score(prefix, tonumber(f[2]) or 0, f[4])
  redis.call('HSET', jkey, 'state', 'pending', 'score', score, 'run_at', at)
  to_pending(prefix, id, score, f[3] or nil, at)
  add_history(prefix, id, 'rescheduled', at, {was_due = was_due})
  wake(prefix, 0)
  return {'rescheduled', 'pending', at}
end
if state == 'pending' then
  if f[3] then
    group_remove_pending(prefix, f[3], id, at)
  else
    redis.call('ZREM', pending_key, id)
  end
  redis.call('HDEL', jkey, 'score')
end
redis.call('HSET', jkey, 'state', 'scheduled', 'run_at', run_at)
redis.call('ZADD', scheduled_key, run_at, id)
add_history(prefix, id, 'rescheduled', at, {run_at = run_at, was_due = was_due})
wake(prefix, run_at)
return {'rescheduled', 'scheduled', run_at}
