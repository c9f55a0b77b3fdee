--[[
  throttle: a running job's handler throttled its queue, or its own group
  (`current().throttle`, e.g. on an HTTP 429): no supervisor claims from the queue (the
  group starts no job) until Redis time + ARGV[4] ms, and the job goes back to pending
  at its place with nothing counted (as a release), to run once the throttle ends.
  Which queue and group is not the child's to say: this job's queue, and the group in
  its record.

  KEYS[1]  forq:{q}:active      zset
  KEYS[2]  forq:{q}:limits      hash: field `throttled_until` (includes/throttle)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  fencing token
  ARGV[4]  how long, ms (checked and cut to the queue's max_throttle by the supervisor;
           0: nothing is throttled, the job only goes back)
  ARGV[5]  "queue", or "group" (the job's own; a job without a group throttles nothing)
  ARGV[6]  reason (for the history)

  Returns {"throttled", until_ms} (until_ms: the throttle's end in force, 0 when none
  was set), {"cancelled", 0} when the job's cancel had been requested (it is finished
  as cancelled instead of going back; the throttle still holds), or {"lost", 0} when
  the token is stale (nothing changes). History: "throttled" {reason, until, scope,
  group}.
  Transitions: active -> pending, active -> cancelled
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  Transitions: [*] -> pending, [*] -> scheduled
  (a cancelled job releases the jobs waiting on it, or sends them to dead; the end of a
  batch's last member enqueues the batch's callbacks)
]]
--@include includes/time
--@include includes/job
--@include includes/fencing
--@include includes/history
--@include includes/wake
--@include includes/pending
--@include includes/cancel_active
--@include includes/throttle

local prefix, id, token = ARGV[1], ARGV[2], ARGV[3]
local delay, scope, reason = math.floor(tonumber(ARGV[4]) or 0), ARGV[5], ARGV[6]
local jkey = job_key(prefix, id)
local f = held(jkey, token, 'group', 'cancel_requested')
if not f then return {'lost', 0} end
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
  return {'cancelled', 0}
end
back_to_pending(prefix, id, jkey, at)
local entry = {reason = reason, ['until'] = ends, scope = scope}
if group then entry['group'] = group end
add_history(prefix, id, 'throttled', at, entry)
if ends == 0 then wake(prefix, 0) end -- nothing throttled: it may run again now
return {'throttled', ends}
