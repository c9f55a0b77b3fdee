--[[
  claim: promote due scheduled jobs, then lease up to N pending jobs to one supervisor.

  KEYS[1]  forq:{q}:pending     zset
  KEYS[2]  forq:{q}:scheduled   zset (run-at ms)
  KEYS[3]  forq:{q}:active      zset (lease deadline ms)
  KEYS[4]  forq:{q}:limits      hash: max_in_flight, rate (tokens per ms), burst
  KEYS[5]  forq:{q}:bucket      hash: tokens, ts   (the global rate-limit token bucket)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  supervisor id (lease owner)
  ARGV[3]  N, the most jobs to lease
  ARGV[4]  lease ttl (ms)
  ARGV[5]  job policy JSON {"defaults": {...}, "tasks": {name: {...}}} or "" — fills
           every limit the producer left unset, so fail/expire/reclaim read one record

  Returns {next_due_ms, wait_ms, pending_left, held, now_ms, job1, job2, ...}
    next_due_ms   earliest scheduled run-at, or -1
    wait_ms       >0 when the rate limit held jobs back: ms until the next token
    pending_left  pending jobs still waiting after this claim
    held          1 when max_in_flight held jobs back (a finishing job publishes a wake)
    now_ms        Redis time of this claim, to turn next_due_ms into a delay
    jobN          the leased job's record as a flat HGETALL list (includes token)
  Cost: O(log n) per job leased and per job promoted, whatever the backlog.
]]
--@include _lib

local pending_key, scheduled_key, active_key, limits_key, bucket_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, owner = ARGV[1], ARGV[2]
local want = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local at = now_ms()

-- 1. promote due scheduled jobs (bounded per call; the rest on the next call)
local due = redis.call('ZRANGEBYSCORE', scheduled_key, '-inf', at, 'LIMIT', 0, 1000)
for _, id in ipairs(due) do
  local jkey = job_key(prefix, id)
  redis.call('ZREM', scheduled_key, id)
  if redis.call('EXISTS', jkey) == 1 then
    local score = pending_score(prefix, num_field(jkey, 'priority', 0))
    redis.call('HSET', jkey, 'state', 'pending', 'score', score)
    redis.call('ZADD', pending_key, score, id)
  end
end

-- 2. global limits, shared by every supervisor through these two hashes
local wait_ms = 0
local held = 0
local limits = redis.call('HMGET', limits_key, 'max_in_flight', 'rate', 'burst')
local max_in_flight = tonumber(limits[1])
if max_in_flight and max_in_flight > 0 then
  local room = max_in_flight - redis.call('ZCARD', active_key)
  if room < want then
    want = math.max(room, 0)
    held = 1
  end
end
local rate = tonumber(limits[2])
local tokens = nil
if rate and rate > 0 and want > 0 then
  local burst = tonumber(limits[3]) or 1
  local b = redis.call('HMGET', bucket_key, 'tokens', 'ts')
  tokens = tonumber(b[1]) or burst
  local ts = tonumber(b[2]) or at
  -- capped even when no time passed: a lowered limit also lowers the burst at once
  tokens = math.min(burst, tokens + math.max(0, at - ts) * rate)
  if tokens < want then
    -- held back, even if partly served: say when the next token comes, so a supervisor
    -- with free slots left claims again then instead of waiting for a job to finish
    want = math.floor(tokens)
    if redis.call('ZCARD', pending_key) > want then
      wait_ms = math.ceil((1 - (tokens - want)) / rate)
    end
  end
end

-- 3. lease
local out = {}
local leased = 0
local policy = nil
if ARGV[5] ~= '' then policy = cjson.decode(ARGV[5]) end
if want > 0 then
  local popped = redis.call('ZPOPMIN', pending_key, want)
  for i = 1, #popped, 2 do
    local id = popped[i]
    local jkey = job_key(prefix, id)
    if redis.call('EXISTS', jkey) == 1 then
      local done = redis.call('GET', prefix .. 'done:' .. id)
      if done then
        succeed_recorded(prefix, id, jkey, done, at)
      else
        leased = leased + 1
        local token = redis.call('INCR', prefix .. 'token')
        local deadline = at + ttl
        redis.call('HSET', jkey, 'state', 'active', 'owner', owner, 'token', token,
          'lease_deadline', deadline, 'started_at', at)
        if policy then
          local task = redis.call('HGET', jkey, 'task')
          local p = (policy['tasks'] and policy['tasks'][task]) or policy['defaults'] or {}
          for f, v in pairs(p) do redis.call('HSETNX', jkey, f, tostring(v)) end
        end
        redis.call('ZADD', active_key, deadline, id)
        add_history(prefix, id, 'claimed', at, {owner = owner, token = token})
        out[#out + 1] = redis.call('HGETALL', jkey)
      end
    end
  end
end
if tokens ~= nil then
  redis.call('HSET', bucket_key, 'tokens', tostring(tokens - leased), 'ts', at)
end

local next_due = -1
local first = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
if first[2] then next_due = tonumber(first[2]) end
local result = {next_due, wait_ms, redis.call('ZCARD', pending_key), held, at}
for _, job in ipairs(out) do result[#result + 1] = job end
return result
