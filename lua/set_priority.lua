--[[
  set_priority: change a job's priority before it runs. A pending job moves to its new
  place at once: the tail of the new priority (the head for a lifo job), as if it had
  just been enqueued with it; a scheduled or waiting job keeps the new priority for when
  it becomes pending. No state changes.

  KEYS[1]  forq:{q}:pending     zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  the new priority, an integer in [-1000, 1000]

  Returns {"changed", state}, or {"refused", state} when the job is not pending,
  scheduled or waiting (nothing changed), or {"missing", ""} when there is no such job.
  An error reply "forq: priority ..." for a priority out of range.
  Transitions: none
]]
--@include includes/time
--@include includes/job
--@include includes/history
--@include includes/groups
--@include includes/pending

local pending_key = KEYS[1]
local prefix, id = ARGV[1], ARGV[2]
local priority = tonumber(ARGV[3])
if not priority or priority ~= math.floor(priority) or math.abs(priority) > 1000 then
  return redis.error_reply('forq: priority must be an integer in [-1000, 1000], got ' .. ARGV[3])
end
local jkey = job_key(prefix, id)
local f = redis.call('HMGET', jkey, 'state', 'priority', 'group', 'lifo')
local state = f[1]
if not state then return {'missing', ''} end
if state ~= 'pending' and state ~= 'scheduled' and state ~= 'waiting' then
  return {'refused', state}
end
local at = now_ms()
redis.call('HSET', jkey, 'priority', priority)
if state == 'pending' then
  local score = pending_score(prefix, priority, f[4])
  redis.call('HSET', jkey, 'score', score)
  if f[3] then
    -- its group's head may change: the group's place in the ready set follows it
    redis.call('ZADD', group_pending_key(prefix, f[3]), 'XX', score, id)
    group_place(prefix, f[3], at)
  else
    redis.call('ZADD', pending_key, 'XX', score, id)
  end
end
add_history(prefix, id, 'priority', at, {from = tonumber(f[2]) or 0, to = priority})
return {'changed', state}
