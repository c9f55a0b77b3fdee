--[[
  sweep_expired: the reaper's pass over jobs whose expiry before start (enqueue's
  expires_in / expire_at) has passed while they wait in pending or scheduled, so they
  do not sit in the backlog until a claim reaches them (or, paused or delayed, never).
  Each goes to dead with the reason "expired before start", as claim does. Run by every
  supervisor; concurrent runs are safe (each job is moved by the first call to see it).

  KEYS[1]  forq:{q}:expiring    zset (expire_at ms), written by enqueue
  KEYS[2]  forq:{q}:pending     zset
  KEYS[3]  forq:{q}:scheduled   zset
  KEYS[4]  forq:{q}:dead        zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  the most index entries to look at in this call
  ARGV[3]  sweeper (supervisor id), for the history

  Returns {expired, id1, id2, ...}: how many went to dead, then their ids. Index entries
  of jobs that started, finished or are gone are dropped without counting.
  Cost: O(log n) per entry looked at; nothing when no expiry has passed.
  Transitions: pending -> dead, scheduled -> dead
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  Transitions: [*] -> pending, [*] -> scheduled
  (a job that ends releases the jobs waiting on it, or sends them to dead; the end of
  a batch's last member enqueues the batch's callbacks)
  Events: dead, enqueued
]]
--@include includes/time
--@include includes/job
--@include includes/groups
--@include includes/expire_unstarted

local expiring_key, pending_key, scheduled_key = KEYS[1], KEYS[2], KEYS[3]
local prefix, limit, sweeper = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local at = now_ms()
local out = {0}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', expiring_key, '-inf', at, 'LIMIT', 0, limit)) do
  local jkey = job_key(prefix, id)
  local f = redis.call('HMGET', jkey, 'state', 'group', 'started_at', 'parked')
  if (f[1] == 'pending' or f[1] == 'scheduled') and not f[3] then
    if f[1] == 'scheduled' then
      redis.call('ZREM', scheduled_key, id)
    elseif f[2] then
      group_remove_pending(prefix, f[2], id, at)
    else
      redis.call('ZREM', pending_key, id)
    end
    -- parked by its task's circuit breaker (claim.lua): out of its parked set too
    if f[4] then redis.call('ZREM', prefix .. 'parked:' .. f[4], id) end
    expire_unstarted(prefix, id, jkey, at, sweeper)
    out[1] = out[1] + 1
    out[#out + 1] = id
  else
    redis.call('ZREM', expiring_key, id)
  end
end
return out
