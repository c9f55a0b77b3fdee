--[[
  throttle: a running job's handler throttled its queue, or its own group
  (`current().throttle`, e.g. on an HTTP 429): no supervisor claims from the queue (the
  group starts no job) until Redis time + ARGV[4] ms, and the job goes back to pending
  at its place, no attempt counted, to run once the throttle ends. Which queue and group
  is not the child's to say: this job's queue, and the group in its record. A throttle
  puts the job off as a snooze does (`raise Retry`): it adds one to the job's
  `snoozes`, and the one past its max_snoozes (default 100) sends it to dead instead
  (the throttle still holds), so a job cannot throttle forever either.

  KEYS[1]  forq:{q}:active      zset
  KEYS[2]  forq:{q}:limits      hash: field `throttled_until` (includes/throttle)
  KEYS[3]  forq:{q}:dead        zset (score = time of death)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  fencing token
  ARGV[4]  how long, ms (checked and cut to the queue's max_throttle by the supervisor;
           0: nothing is throttled, the job only goes back)
  ARGV[5]  "queue", or "group" (the job's own; a job without a group throttles nothing)
  ARGV[6]  reason (for the history)

  Returns {"throttled", until_ms} (until_ms: the throttle's end in force, 0 when none
  was set), {"dead", until_ms} past max_snoozes, {"cancelled", until_ms} when the job's
  cancel had been requested (it is finished as cancelled instead of going back), or
  {"lost", 0} when the token is stale (nothing changes). History: "throttled" {reason,
  until, scope, group, snoozes}.
  Transitions: active -> pending, active -> cancelled, active -> dead
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  Transitions: [*] -> pending, [*] -> scheduled
  (a job that ends releases the jobs waiting on it, or sends them to dead; the end of a
  batch's last member enqueues the batch's callbacks)
  Events: snoozed, dead, cancelled, enqueued
]]
--@include includes/time
--@include includes/job
--@include includes/fencing
--@include includes/history
--@include includes/counts
--@include includes/wake
--@include includes/policy
--@include includes/groups
--@include includes/pending
--@include includes/finish
--@include includes/cancel_active
--@include includes/throttle
--@include includes/events
--@include includes/on_dead

local prefix, id, token = ARGV[1], ARGV[2], ARGV[3]
local delay, scope, reason = math.floor(tonumber(ARGV[4]) or 0), ARGV[5], ARGV[6]
local jkey = job_key(prefix, id)
local f = held(jkey, token, 'group', 'cancel_requested')
if not f then return {'lost', 0} end
event_job(prefix, id) -- its events name its supervisor, whose lease fields go below
local at = now_ms()
local group = nil
if scope == 'group' then group = f[3] end
local ends = 0
if delay > 0 and (scope == 'queue' or group) then
  -- before the job goes back: its group, placed again then, sees the throttle
  ends = throttle(prefix, group, at + delay, at)
end
if f[4] then
  cancel_active(prefix, id, jkey, at, 'cancel requested; throttled: ' .. reason)
  return {'cancelled', ends}
end
local snoozes = redis.call('HINCRBY', jkey, 'snoozes', 1)
local limits = job_limits(prefix, jkey, {max_snoozes = 100})
count(prefix, 'throttled', at)
if snoozes > limits.max_snoozes then
  local why = reason .. ' (throttled; snoozed ' .. snoozes .. ' times, over max_snoozes ' ..
    limits.max_snoozes .. ')'
  redis.call('ZREM', KEYS[1], id)
  if f[3] then group_release(prefix, f[3], at) end
  redis.call('HDEL', jkey, 'owner', 'token', 'lease_deadline', 'cancel_requested')
  redis.call('HSET', jkey, 'state', 'dead', 'dead_reason', why, 'finished_at', at)
  redis.call('ZADD', KEYS[3], at, id)
  add_history(prefix, id, 'dead', at, {reason = why})
  job_died(prefix, id, why, at, true)
  count(prefix, 'dead', at)
  finish(prefix, id, -1, at)
  slot_freed(prefix)
  return {'dead', ends}
end
back_to_pending(prefix, id, jkey, at)
local entry = {reason = reason, ['until'] = ends, scope = scope, snoozes = snoozes}
if group then entry['group'] = group end
add_history(prefix, id, 'throttled', at, entry)
emit(prefix, 'snoozed', id, nil, true, reason, {'throttled_until', ends})
if ends == 0 then wake(prefix, 0) end -- nothing throttled: it may run again now
return {'throttled', ends}
