--[[
  expire: a parent reports that its child died without a result (signal, exit code,
  OOM kill). The lease is marked expired now, so the next reaper pass — which the
  parent triggers at once — reclaims the job instead of waiting out the TTL.

  KEYS[1]  forq:{q}:active      zset (lease deadline ms)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  fencing token
  ARGV[4]  crash reason, e.g. "killed by SIGSEGV (peak RSS 41.2MiB)"
  ARGV[5]  (optional) the crash's pattern for the task's circuit breaker, as the parent
           saw it ("signal:SIGSEGV", "exit:3", "malformed"; "" counts none): see
           includes/breaker
  ARGV[6]  the run's cost ("" or absent: none; see includes/cost)

  Returns "ok", or "lost" when the token is stale (nothing changes). The crash counts in
  the task's circuit breaker here, where the parent names it, not in reclaim (a lease
  that expired because its supervisor died is no fault of the task).
  Transitions: none
  Events: tripped
]]
--@include includes/time
--@include includes/job
--@include includes/fencing
--@include includes/history
--@include includes/events
--@include includes/breaker
--@include includes/cost

local active_key = KEYS[1]
local prefix, id, token, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local jkey = job_key(prefix, id)
local f = held(jkey, token, 'task', 'group')
if not f then return 'lost' end
local at = now_ms()
local trip = breaker_end(prefix, id, jkey, f[3], ARGV[5], at)
-- this crash tripped its task: on the stream, on the supervisor (the lease's owner)
if trip then emit(prefix, 'tripped', id, f[3], true, trip.pattern, {'jobs', trip.jobs, 'ends', trip.ends,
    'of', trip.of, 'window_ms', trip.window_ms, 'until', trip['until']}) end
redis.call('HSET', jkey, 'last_crash', reason, 'lease_deadline', 0)
local totals = {}
if record_cost(jkey, ARGV[6], f[4], totals) then add_usage(prefix, totals, at) end
redis.call('ZADD', active_key, 0, id)
add_history(prefix, id, 'crashed', at, {reason = reason})
return 'ok'
