--[[
  breaker: the per-task circuit breaker. How each task's jobs end is counted; when
  `breaker_failures` distinct jobs of a task end the same way (a pattern the supervisor
  observed: "signal:SIGSEGV", "timeout", "memory", "exception:KeyError", ...) within
  `breaker_window_ms`, and that way is at least `breaker_ratio` of all the task's ends in
  the window (successes included), the task is tripped: its name in the hash
  `prefix .. "tripped"` (task -> JSON reason) and the count in the limits hash's
  `tripped` field, which claim reads with the limits it reads anyway; claim parks the
  tripped task's jobs (`prefix .. "parked:" .. task`), resume_task.lua puts them back.
  Keys, all bounded:
    breaker:ends:<10 s bucket>   hash, field TASK: its ends; field "p" .. sha: the ends of
                                 one task+pattern (expires after 11 minutes: the longest
                                 window, 10 minutes, and a bucket)
    breaker:jobs:<sha>           zset job id -> last end of that pattern, at most
                                 `breaker_failures` members, expires after the window
]]
--@include includes/policy

local BREAKER_BUCKET_MS = 10000
local BREAKER_KEEP_MS = 660000
local BREAKER_WINDOW_MAX_MS = 600000

-- the breaker's limits (jobs/defaults.py's breaker.* rows)
local BREAKER_DEFAULTS = {breaker_failures = 20, breaker_window_ms = 60000,
  breaker_ratio = 0.9, breaker_cooldown_ms = 600000}

-- `n` more ends of `task` now (ack: its successes; breaker_end: a failure or a crash).
local function breaker_count(prefix, task, at, n)
  local key = prefix .. 'breaker:ends:' .. math.floor(at / BREAKER_BUCKET_MS)
  if redis.call('HINCRBY', key, task, n) == n then redis.call('PEXPIRE', key, BREAKER_KEEP_MS) end
end

-- A job of `task` ended the way `pattern` names ("" when no pattern counts: the end is
-- counted, not held against the task). Trips the task when the condition above holds.
-- Returns the trip's reason (a table) when this end tripped it, else nil.
local function breaker_end(prefix, id, jkey, task, pattern, at)
  if not task then return nil end
  breaker_count(prefix, task, at, 1)
  if pattern == nil or pattern == '' then return nil end
  local cfg = job_limits(prefix, jkey, BREAKER_DEFAULTS)
  local most = math.floor(cfg.breaker_failures)
  local window = math.min(cfg.breaker_window_ms, BREAKER_WINDOW_MAX_MS)
  if most <= 0 or window <= 0 then return nil end
  local sha = redis.sha1hex(task .. '\0' .. pattern)
  local bucket = math.floor(at / BREAKER_BUCKET_MS)
  local ends_key = prefix .. 'breaker:ends:' .. bucket
  redis.call('HINCRBY', ends_key, 'p' .. sha, 1)
  -- a job that was running when its task tripped counts towards no next trip: the
  -- count starts afresh at the resume, with the jobs that run from then on
  local tripped_key = prefix .. 'tripped'
  if redis.call('HEXISTS', tripped_key, task) == 1 then return nil end
  local jobs = prefix .. 'breaker:jobs:' .. sha
  redis.call('ZADD', jobs, at, id)
  redis.call('ZREMRANGEBYSCORE', jobs, '-inf', at - window)
  redis.call('ZREMRANGEBYRANK', jobs, 0, -(most + 1))
  redis.call('PEXPIRE', jobs, window)
  local distinct = redis.call('ZCARD', jobs)
  if distinct < most then return nil end
  local total, same = 0, 0
  for b = math.floor((at - window) / BREAKER_BUCKET_MS), bucket do
    local v = redis.call('HMGET', prefix .. 'breaker:ends:' .. b, task, 'p' .. sha)
    total = total + (tonumber(v[1]) or 0)
    same = same + (tonumber(v[2]) or 0)
  end
  if same < cfg.breaker_ratio * total then return nil end
  local cooldown = math.floor(cfg.breaker_cooldown_ms)
  local reason = {pattern = pattern, jobs = distinct, ends = same, of = total,
    window_ms = window, at = at, ['until'] = cooldown > 0 and at + cooldown or 0}
  redis.call('HSET', tripped_key, task, cjson.encode(reason))
  redis.call('HSET', prefix .. 'limits', 'tripped', redis.call('HLEN', tripped_key))
  redis.call('DEL', jobs) -- counted afresh once it is resumed
  return reason
end
