--[[
  cancel: stop a job for good. A scheduled, pending or waiting job becomes cancelled at once;
  (a pending one parked by its task's circuit breaker leaves its parked set); an active
  one is flagged, and its supervisor learns of it from its next extend call,
  kills the child and finishes the job as cancelled (fail with mode "cancel").

  KEYS[1]  forq:{q}:pending     zset
  KEYS[2]  forq:{q}:scheduled   zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  "" (any state), or the state the job must be in: in another, nothing changes
           and the reply is that state (a bulk cancel of the scheduled jobs leaves one
           that started meanwhile alone)

  Returns "cancelled" | "cancelling" (active; its supervisor will stop it) |
          "missing" | the terminal state it already has ("succeeded", "dead", "cancelled")
          | with ARGV[3], the state it is in when that is another
  Transitions: pending -> cancelled, scheduled -> cancelled, waiting -> cancelled
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  Transitions: [*] -> pending, [*] -> scheduled
  (a job that ends releases the jobs waiting on it, or sends them to dead; the end of
  a batch's last member enqueues the batch's callbacks)
  Events: cancelled, dead, enqueued
]]
--@include includes/time
--@include includes/job
--@include includes/history
--@include includes/counts
--@include includes/groups
--@include includes/finish
--@include includes/events

local pending_key, scheduled_key = KEYS[1], KEYS[2]
local prefix, id = ARGV[1], ARGV[2]
local jkey = job_key(prefix, id)
local f = redis.call('HMGET', jkey, 'state', 'group', 'parked')
local state = f[1]
if not state then return 'missing' end
if ARGV[3] and ARGV[3] ~= '' and state ~= ARGV[3] then return state end
local at = now_ms()
if state == 'pending' or state == 'scheduled' or state == 'waiting' then
  if f[2] and state == 'pending' then
    group_remove_pending(prefix, f[2], id, at)
  else
    redis.call('ZREM', pending_key, id)
  end
  redis.call('ZREM', scheduled_key, id)
  -- parked by its task's circuit breaker (claim.lua): out of its parked set too
  if f[3] then redis.call('ZREM', prefix .. 'parked:' .. f[3], id) end
  if state == 'waiting' then redis.call('ZREM', prefix .. 'waiting', id) end
  redis.call('HSET', jkey, 'state', 'cancelled', 'finished_at', at)
  add_history(prefix, id, 'cancelled', at, {})
  emit(prefix, 'cancelled', id)
  count(prefix, 'cancelled', at)
  finish(prefix, id, num_field(jkey, 'result_ttl_ms', DEFAULT_RESULT_TTL_MS), at)
  return 'cancelled'
elseif state == 'active' then
  redis.call('HSET', jkey, 'cancel_requested', at)
  add_history(prefix, id, 'cancel requested', at, {})
  return 'cancelling'
end
return state
