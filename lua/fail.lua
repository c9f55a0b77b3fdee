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
           unknown task or a non-retryable error) or "cancel" (cancelled, no retry)
  ARGV[6]  a uniform random number in [0, 1) for the jitter (scripts stay deterministic)

  Returns {"retry", run_at_ms, attempts} | {"dead", 0, attempts} |
          {"cancelled", 0, attempts} | {"lost", 0, 0} (stale token: nothing changes)
  Backoff before retry n (n = attempts so far): min(max, base * factor^(n-1)),
  scaled by a factor drawn from [1 - jitter, 1 + jitter].
  Transitions: active -> scheduled, active -> dead, active -> cancelled
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  Transitions: [*] -> pending, [*] -> scheduled
  (a job that ends releases the jobs waiting on it, or sends them to dead; the end of
  a batch's last member enqueues the batch's callbacks)
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

local active_key, scheduled_key, dead_key = KEYS[1], KEYS[2], KEYS[3]
local prefix, id, token, err, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local r = tonumber(ARGV[6]) or 0.5
local jkey = job_key(prefix, id)
local f = held(jkey, token, 'cancel_requested', 'group')
if not f then return {'lost', 0, 0} end
if f[3] and mode == 'retry' then mode = 'cancel' end -- a requested cancel is not retried
local at = now_ms()
local attempts = redis.call('HINCRBY', jkey, 'attempts', 1)
local limits = job_limits(prefix, jkey, {max_attempts = 5, backoff_base_ms = 1000,
  backoff_factor = 2, backoff_max_ms = 600000, backoff_jitter = 0.2})
local max_attempts = limits.max_attempts
local decoded = cjson.decode(err)
local reason = decoded['reason'] or decoded['message'] or 'error'
redis.call('ZREM', active_key, id)
if f[4] then group_release(prefix, f[4], at) end -- its group's slot, whatever follows
redis.call('HDEL', jkey, 'owner', 'token', 'lease_deadline', 'cancel_requested')
redis.call('HSET', jkey, 'error', err, 'finished_at', at)
count(prefix, 'failed', at)

local outcome
if mode == 'cancel' then
  redis.call('HSET', jkey, 'state', 'cancelled')
  add_history(prefix, id, 'cancelled', at, {reason = reason})
  finish(prefix, id, num_field(jkey, 'result_ttl_ms', DEFAULT_RESULT_TTL_MS), at)
  slot_freed(prefix)
  return {'cancelled', 0, attempts}
elseif mode == 'fatal' or attempts >= max_attempts then
  local why = reason
  if mode ~= 'fatal' then why = reason .. ' (attempts exhausted: ' .. attempts .. ')' end
  redis.call('HSET', jkey, 'state', 'dead', 'dead_reason', why)
  redis.call('ZADD', dead_key, at, id)
  add_history(prefix, id, 'dead', at, {reason = why})
  count(prefix, 'dead', at)
  finish(prefix, id, -1, at)
  slot_freed(prefix)
  return {'dead', 0, attempts}
end
local base, factor = limits.backoff_base_ms, limits.backoff_factor
local cap, jitter = limits.backoff_max_ms, limits.backoff_jitter
local delay = math.min(cap, base * factor ^ (attempts - 1))
delay = math.floor(delay * (1 + jitter * (2 * r - 1)))
local run_at = at + delay
redis.call('HSET', jkey, 'state', 'scheduled', 'run_at', run_at)
redis.call('ZADD', scheduled_key, run_at, id)
add_history(prefix, id, 'retry', at, {reason = reason, run_at = run_at, attempts = attempts})
count(prefix, 'retried', at)
wake(prefix, run_at)
slot_freed(prefix)
return {'retry', run_at, attempts}
