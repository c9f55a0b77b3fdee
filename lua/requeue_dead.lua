--[[
  requeue_dead: give dead jobs a fresh start in pending (attempts and crashes reset).

  KEYS[1]  forq:{q}:dead        zset
  KEYS[2]  forq:{q}:pending     zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  "ids" to requeue ARGV[3..], or "all" to requeue up to ARGV[3] of the oldest

  Returns {requeued_count, missing_id1, ...}: ids given that were not dead are listed.
  Transitions: dead -> pending
]]
--@include includes/time
--@include includes/job
--@include includes/history
--@include includes/wake
--@include includes/dead_letter
--@include includes/pending

local dead_key, pending_key = KEYS[1], KEYS[2]
local prefix, mode = ARGV[1], ARGV[2]
local ids = dead_ids(dead_key, mode)
local at = now_ms()
local n, missing = 0, {}
for _, id in ipairs(ids) do
  local jkey = job_key(prefix, id)
  if redis.call('ZREM', dead_key, id) == 1 and redis.call('EXISTS', jkey) == 1 then
    local f = redis.call('HMGET', jkey, 'priority', 'group', 'lifo')
    local score = pending_score(prefix, tonumber(f[1]) or 0, f[3])
    redis.call('HSET', jkey, 'state', 'pending', 'score', score, 'attempts', 0, 'crashes', 0)
    redis.call('HDEL', jkey, 'dead_reason', 'finished_at', 'expire_at') -- runs, late or not
    redis.call('PERSIST', jkey)
    redis.call('PERSIST', jkey .. ':history')
    to_pending(prefix, id, score, f[2], at)
    add_history(prefix, id, 'requeued', at, {})
    n = n + 1
  else
    missing[#missing + 1] = id
  end
end
if n > 0 then wake(prefix, 0) end
local out = {n}
for _, id in ipairs(missing) do out[#out + 1] = id end
return out
