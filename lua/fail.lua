--[[
  fail: the handler raised, or broke a limit. Count an attempt, then retry after an
  exponential backoff with jitter, or dead-letter the job.

  KEYS[1]  forq:{q}:active      zset
  KEYS[2]  forq:{q}:scheduled   zset
  KEYS[3]  forq:{q}:dead        zset (score = time of death)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  fencing token
  ARGV[4]  error JSON {type, message, traceback, reason}
  ARGV[5]  mode: "retry" (retry while attempts remain), "fatal" (dead now, e.g. an
           unknown task or a non-retryable error), "cancel" (cancelled, no retry) or
           "snooze" (the handler's own `raise Retry(...)`: again after ARGV[7] ms)
  ARGV[6]  a uniform random number in [0, 1) for the jitter (scripts stay deterministic)
  ARGV[7]  snooze: the delay in ms (checked and capped by the supervisor)
  ARGV[8]  snooze: "1" when it counts as an attempt, "0" when not
  ARGV[9]  (optional) the end's pattern for the task's circuit breaker, as the parent saw
           it ("timeout", "memory", "exception:KeyError"; "" counts none): see
           includes/breaker (a snooze or a cancel counts in no breaker)
  ARGV[10] the run's cost ("" or absent: none; see includes/cost)

  Returns {"retry", run_at_ms, attempts} | {"snoozed", run_at_ms, attempts} |
          {"dead", 0, attempts} | {"cancelled", 0, attempts} |
          {"lost", 0, 0} (stale token: nothing changes)
  Backoff before retry n (n = attempts so far): min(max, base * factor^(n-1)),
  scaled by a factor drawn from [1 - jitter, 1 + jitter].
  A snooze is no failure: no `error`, counted in the queue's `snoozed` (not `failed`),
  an attempt only when ARGV[8] says so; every snooze adds one to the job's `snoozes`,
  and the one past its max_snoozes (default 100) sends it to dead instead, as does a
  counted one past max_attempts. Its history entry is "snoozed" {reason, run_at,
  snoozes, counted}.
  Transitions: active -> scheduled, active -> dead, active -> cancelled
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  Transitions: [*] -> pending, [*] -> scheduled
  (a job that ends releases the jobs waiting on it, or sends them to dead; the end of
  a batch's last member enqueues the batch's callbacks)
  Events: failed, retried, snoozed, dead, cancelled, enqueued, tripped
]]
--@include includes/time
--@include includes/job
--@include includes/fencing
--@include includes/history
--@include includes/counts
--@include includes/wake
--@include includes/policy
--@include includes/groups
--@include includes/finish
--@include includes/events
--@include includes/on_dead
--@include includes/breaker
--@include includes/cost

local active_key, scheduled_key, dead_key = KEYS[1], KEYS[2], KEYS[3]
local prefix, id, token, err, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local r = tonumber(ARGV[6]) or 0.5
local jkey = job_key(prefix, id)
local f = held(jkey, token, 'cancel_requested', 'group', 'task')
if not f then return {'lost', 0, 0} end
-- a requested cancel is not retried, nor snoozed
if f[3] and (mode == 'retry' or mode == 'snooze') then mode = 'cancel' end
local snooze = mode == 'snooze'
local counted = not snooze or ARGV[8] == '1'
local at = now_ms()
if mode ~= 'cancel' and not snooze then
  local trip = breaker_end(prefix, id, jkey, f[5], ARGV[9], at)
  -- this end tripped its task: on the stream, on the supervisor (the lease's owner)
  if trip then emit(prefix, 'tripped', id, f[5], true, trip.pattern, {'jobs', trip.jobs, 'ends', trip.ends,
    'of', trip.of, 'window_ms', trip.window_ms, 'until', trip['until']}) end
end
local attempts
if counted then
  attempts = redis.call('HINCRBY', jkey, 'attempts', 1)
else
  attempts = num_field(jkey, 'attempts', 0)
end
local limits = job_limits(prefix, jkey, {max_attempts = 5, backoff_base_ms = 1000,
  backoff_factor = 2, backoff_max_ms = 600000, backoff_jitter = 0.2, max_snoozes = 100})
local max_attempts = limits.max_attempts
local decoded = cjson.decode(err)
local reason = decoded['reason'] or decoded['message'] or 'error'
-- before the lease's fields go: the event names the supervisor (the later ones too)
if mode == 'cancel' then emit(prefix, 'cancelled', id, nil, true, reason)
elseif snooze then event_job(prefix, id) -- its event comes with its run_at, below
else emit(prefix, 'failed', id, nil, true, reason, {'attempt', attempts}) end
redis.call('ZREM', active_key, id)
if f[4] then group_release(prefix, f[4], at) end -- its group's slot, whatever follows
local totals = {}
if record_cost(jkey, ARGV[10], f[4], totals) then add_usage(prefix, totals, at) end
redis.call('HDEL', jkey, 'owner', 'token', 'lease_deadline', 'cancel_requested')
local snoozes = 0
if snooze then
  snoozes = redis.call('HINCRBY', jkey, 'snoozes', 1)
  count(prefix, 'snoozed', at)
else
  redis.call('HSET', jkey, 'error', err, 'finished_at', at)
  count(prefix, 'failed', at)
end

local function to_dead(why)
  if snooze then redis.call('HSET', jkey, 'finished_at', at) end
  redis.call('HSET', jkey, 'state', 'dead', 'dead_reason', why)
  redis.call('ZADD', dead_key, at, id)
  add_history(prefix, id, 'dead', at, {reason = why})
  job_died(prefix, id, why, at, true)
  count(prefix, 'dead', at)
  finish(prefix, id, -1, at)
  slot_freed(prefix)
  return {'dead', 0, attempts}
end

if mode == 'cancel' then
  redis.call('HSET', jkey, 'state', 'cancelled')
  add_history(prefix, id, 'cancelled', at, {reason = reason})
  finish(prefix, id, num_field(jkey, 'result_ttl_ms', DEFAULT_RESULT_TTL_MS), at)
  slot_freed(prefix)
  return {'cancelled', 0, attempts}
elseif snooze then
  if snoozes > limits.max_snoozes then
    return to_dead(reason .. ' (snoozed ' .. snoozes .. ' times, over max_snoozes ' ..
                   limits.max_snoozes .. ')')
  elseif counted and attempts >= max_attempts then
    return to_dead(reason .. ' (attempts exhausted: ' .. attempts .. ')')
  end
  local run_at = at + math.max(0, math.floor(tonumber(ARGV[7]) or 0))
  redis.call('HSET', jkey, 'state', 'scheduled', 'run_at', run_at)
  redis.call('ZADD', scheduled_key, run_at, id)
  local entry = {reason = reason, run_at = run_at, snoozes = snoozes}
  if ARGV[8] == '1' then entry['counted'] = true end
  add_history(prefix, id, 'snoozed', at, entry)
  emit(prefix, 'snoozed', id, nil, true, reason,
       counted and {'run_at', run_at, 'attempt', attempts} or {'run_at', run_at})
  wake(prefix, run_at)
  slot_freed(prefix)
  return {'snoozed', run_at, attempts}
elseif mode == 'fatal' or attempts >= max_attempts then
  local why = reason
  if mode ~= 'fatal' then why = reason .. ' (attempts exhausted: ' .. attempts .. ')' end
  return to_dead(why)
end
local base, factor = limits.backoff_base_ms, limits.backoff_factor
local cap, jitter = limits.backoff_max_ms, limits.backoff_jitter
local delay = math.min(cap, base * factor ^ (attempts - 1))
delay = math.floor(delay * (1 + jitter * (2 * r - 1)))
local run_at = at + delay
redis.call('HSET', jkey, 'state', 'scheduled', 'run_at', run_at)
redis.call('ZADD', scheduled_key, run_at, id)
add_history(prefix, id, 'retry', at, {reason = reason, run_at = run_at, attempts = attempts})
emit(prefix, 'retried', id, nil, true, nil, {'run_at', run_at})
count(prefix, 'retried', at)
wake(prefix, run_at)
slot_freed(prefix)
return {'retry', run_at, attempts}
