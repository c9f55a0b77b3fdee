--[[
  groups: per-key concurrency and rate.

  A job enqueued with a `group` (its record's `group` field) never waits in `pending`:
    forq:{q}:gpending:<group>  zset   that group's pending jobs, scored like `pending`
    forq:{q}:groups:ready      zset   groups that may start a job now, scored by the
                                      score of their head job (so claim compares the
                                      head of `pending` with the head of this set)
    forq:{q}:groups:wait       zset   groups held by their rate limit, by the time (ms)
                                      their next token comes (claim moves them back)
    forq:{q}:groups:running    hash   group -> its active jobs (field gone at 0)
    forq:{q}:groups:pending    string how many grouped jobs are pending (for stats)
    forq:{q}:gbucket:<group>   hash   tokens, ts: the group's rate-limit bucket
                                      (expires once full again: absent = full)
  A group is in `ready` exactly when it has a pending job, fewer running than
  group_concurrency and a token (or no group rate); in `wait` when only the token is
  missing; in neither otherwise. `group_place` re-establishes that from the facts, so
  every transition that changes one of them (a job pending, taken, or leaving active)
  calls it in the same script: a crash between two scripts never leaks a slot.
  The limits live in forq:{q}:limits (group_concurrency, group_rate per ms,
  group_burst), with `grouped` set by the first grouped enqueue so claim looks at the
  group sets only on queues that have ever had a grouped job.
  Cost: O(log n) per job in the group's backlog, independent of the number of groups.
]]

local GROUP_DEFAULT_CONCURRENCY = 1 -- a group alone serialises its jobs (SQS FIFO's default)

local function group_pending_key(prefix, g)
  return prefix .. 'gpending:' .. g
end

local function group_bucket_key(prefix, g)
  return prefix .. 'gbucket:' .. g
end

-- The queue's group limits {n, rate (tokens per ms) or nil, burst}, read once per
-- script call; `fields` is {group_concurrency, group_rate, group_burst} when the caller
-- has read them already (claim reads them with the queue's own limits).
local group_cfg = nil
local function group_limits(prefix, fields)
  if group_cfg == nil then
    local l = fields or redis.call('HMGET', prefix .. 'limits', 'group_concurrency',
      'group_rate', 'group_burst')
    local rate = tonumber(l[2])
    if rate and rate <= 0 then rate = nil end
    group_cfg = {n = tonumber(l[1]) or GROUP_DEFAULT_CONCURRENCY, rate = rate,
      burst = tonumber(l[3]) or 1}
  end
  return group_cfg
end

-- The group's tokens now (a bucket refilled at cfg.rate, capped at cfg.burst).
local function group_tokens(prefix, g, cfg, at)
  local b = redis.call('HMGET', group_bucket_key(prefix, g), 'tokens', 'ts')
  local tokens = tonumber(b[1]) or cfg.burst
  local ts = tonumber(b[2]) or at
  return math.min(cfg.burst, tokens + math.max(0, at - ts) * cfg.rate)
end

-- Put group `g` where it belongs: `ready` (scored by its head job), `wait` (by its next
-- token's time) or neither. `running` and `tokens` when the caller knows them.
-- Returns true when the group has just entered `ready` (the caller may wake claimers).
-- Without a group rate, `wait` is left alone (a command a job saved): a group still in
-- it from a rate since removed is due within burst / rate ms, when claim takes it out
-- and places it again; until then being in `ready` too is harmless.
local function group_place(prefix, g, at, running, tokens)
  local cfg = group_limits(prefix)
  local ready, wait = prefix .. 'groups:ready', prefix .. 'groups:wait'
  local head = redis.call('ZRANGE', group_pending_key(prefix, g), 0, 0, 'WITHSCORES')
  if running == nil then
    running = tonumber(redis.call('HGET', prefix .. 'groups:running', g)) or 0
  end
  if head[1] == nil or running >= cfg.n then
    redis.call('ZREM', ready, g)
    if cfg.rate then redis.call('ZREM', wait, g) end
    return false
  end
  if cfg.rate then
    if tokens == nil then tokens = group_tokens(prefix, g, cfg, at) end
    if tokens < 1 then
      redis.call('ZREM', ready, g)
      redis.call('ZADD', wait, at + math.max(1, math.ceil((1 - tokens) / cfg.rate)), g)
      return false
    end
    redis.call('ZREM', wait, g)
  end
  return redis.call('ZADD', ready, head[2], g) == 1
end

-- Job `id` (its pending `score` set) waits in its group. Returns group_place's answer.
-- Marks the queue `grouped` (claim looks at groups only then) whichever way the job
-- came: enqueued, promoted when due (a delayed or retried job), released by its
-- dependencies, requeued.
local function group_add(prefix, g, id, score, at)
  redis.call('HSET', prefix .. 'limits', 'grouped', 1)
  redis.call('ZADD', group_pending_key(prefix, g), score, id)
  redis.call('INCR', prefix .. 'groups:pending')
  return group_place(prefix, g, at)
end

-- A pending grouped job leaves its group without running (cancel).
local function group_remove_pending(prefix, g, id, at)
  if redis.call('ZREM', group_pending_key(prefix, g), id) == 1 then
    redis.call('DECR', prefix .. 'groups:pending')
    group_place(prefix, g, at)
  end
end

-- A grouped job left `active` (any way: ack, fail, reclaim, release, cancel, dead):
-- its slot is free. Wakes the supervisors when that lets the group start a job.
local function group_release(prefix, g, at)
  local key = prefix .. 'groups:running'
  local left = redis.call('HINCRBY', key, g, -1)
  if left <= 0 then
    redis.call('HDEL', key, g)
    left = 0
  end
  if group_place(prefix, g, at, left) then
    redis.call('PUBLISH', prefix .. 'wake', '0')
  end
end

-- A job of group `g` is being leased outside group_take (one that sat in `pending`
-- though it has a group, e.g. written by an older forq): count its slot all the same,
-- so the release that follows it balances.
local function group_occupy(prefix, g)
  redis.call('HINCRBY', prefix .. 'groups:running', g, 1)
end

-- Claim: take the head job of ready group `g` when the group has room and a token,
-- count its slot and token, and re-place the group. Returns id, score or nil.
local function group_take(prefix, g, at)
  local cfg = group_limits(prefix)
  local running = tonumber(redis.call('HGET', prefix .. 'groups:running', g)) or 0
  local tokens = nil
  if cfg.rate then tokens = group_tokens(prefix, g, cfg, at) end
  local popped = {}
  if running < cfg.n and (tokens == nil or tokens >= 1) then
    popped = redis.call('ZPOPMIN', group_pending_key(prefix, g), 1)
  end
  if popped[1] then
    running = redis.call('HINCRBY', prefix .. 'groups:running', g, 1)
    redis.call('DECR', prefix .. 'groups:pending')
    if tokens then
      tokens = tokens - 1
      local bkey = group_bucket_key(prefix, g)
      redis.call('HSET', bkey, 'tokens', tostring(tokens), 'ts', at)
      -- full again (and so the same as absent) within burst / rate ms
      redis.call('PEXPIRE', bkey, math.ceil(cfg.burst / cfg.rate) + 1000)
    end
  end
  group_place(prefix, g, at, running, tokens)
  return popped[1], popped[2]
end
