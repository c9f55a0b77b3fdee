--[[
  finish: a job reached succeeded, dead or cancelled; what its end sets off. Every
  script that ends a job calls `finish`: it acts on the job's links (the jobs waiting
  on it through depends_on, released or sent to dead; its batch, counted), which can
  end other jobs in turn, so these functions call one another.
]]
--@include includes/job
--@include includes/history
--@include includes/counts
--@include includes/wake
--@include includes/pending
--@include includes/batches
--@include includes/on_dead
--@include includes/needed
--@include includes/retain

local FINISHED_CAP = 10000 -- the "recently finished" index keeps this many newest ids

-- A job reached succeeded, dead or cancelled: free its idempotency key (or keep it
-- until `unique_until`), start the record's retention clock, and list it in the capped
-- "recently finished" index (zset by finish time; O(log n)). `key` is
-- the job's idempotency key when the caller has read it already (false: it has none).
-- Retention: `retention_ms` is its result_ttl (0: the record goes now; -1 for a death);
-- a succeeded or dead job enters the retention index (`retain`; `keep` is a succeeded
-- job's, read by `succeed`), a cancelled one expires after `retention_ms`.
-- A finished job's links to other jobs, read with its end: its batch (id, the batch's
-- queue), a batch it opened from its handler, and whether jobs wait on it (depends_on).
-- `links_ended` (below) acts on them; nil fields mean no link, and cost nothing more.
local LINK_FIELDS = {'batch', 'batch_queue', 'child_batch', 'dependents'}
local links_ended -- defined at the end of this file: it enqueues and finishes jobs

local function finish(prefix, id, retention_ms, at, key, state, links, keep)
  local jkey = job_key(prefix, id)
  if links == nil then
    links = redis.call('HMGET', jkey, 'state', unpack(LINK_FIELDS))
    state = table.remove(links, 1)
  end
  if links[1] or links[3] or links[4] then links_ended(prefix, id, state, links, at) end
  if retention_ms ~= 0 then
    local fkey = prefix .. 'finished'
    redis.call('ZADD', fkey, at, id)
    -- a success (every ack: the hot path) leaves the cap to the reaper's trim pass, once
    -- a pass (trim.lua: the index may hold a pass's successes more in between); the
    -- other ends, rarer, keep it at once
    if state ~= 'succeeded' then redis.call('ZREMRANGEBYRANK', fkey, 0, -FINISHED_CAP - 1) end
  end
  if key == nil then key = redis.call('HGET', jkey, 'key') end
  if key then
    local ukey = prefix .. 'unique:' .. key
    if redis.call('GET', ukey) == id then
      local until_ms = num_field(jkey, 'unique_until', 0)
      if until_ms > at then
        redis.call('PEXPIREAT', ukey, until_ms)
      else
        redis.call('DEL', ukey)
      end
    end
  end
  if retention_ms ~= nil and retention_ms >= 0 then
    if retention_ms == 0 then
      redis.call('DEL', jkey, jkey .. ':history', jkey .. ':needed_by')
    elseif state == 'succeeded' then
      -- kept by the reaper's trim (its keep), not by a key expiry: result_ttl caps the age
      retain(prefix, id, state, at + math.min(keep[1], retention_ms), keep[2])
    else
      redis.call('PEXPIRE', jkey, retention_ms)
      redis.call('PEXPIRE', jkey .. ':history', retention_ms)
      if links[4] then redis.call('PEXPIRE', jkey .. ':needed_by', retention_ms) end
    end
  elseif state == 'dead' then
    local f = redis.call('HMGET', jkey, 'policy', 'task', unpack(KEEP_FIELDS.dead))
    keep = keep_of(prefix, 'dead', f[1], f[2], f, 3)
    retain(prefix, id, state, at + keep[1], keep[2])
  end
end

-- A waiting job whose parents all ended: to pending (or scheduled, if its delay is not
-- over yet). Returns the state it is in now.
local function release_waiting(prefix, id, jkey, at)
  redis.call('ZREM', prefix .. 'waiting', id)
  local f = redis.call('HMGET', jkey, 'run_at', 'priority', 'group', 'lifo')
  local run_at = tonumber(f[1]) or at
  local state = 'pending'
  if run_at > at then
    state = 'scheduled'
    redis.call('HSET', jkey, 'state', 'scheduled')
    redis.call('ZADD', prefix .. 'scheduled', run_at, id)
    wake(prefix, run_at)
  else
    local score = pending_score(prefix, tonumber(f[2]) or 0, f[4])
    redis.call('HSET', jkey, 'state', 'pending', 'score', score)
    to_pending(prefix, id, score, f[3] or nil, at)
    wake(prefix, 0)
  end
  add_history(prefix, id, 'released', at, {state = state})
  return state
end

-- A waiting job whose parent `parent` ended `pstate` (dead, cancelled) goes to dead.
local function dependency_failed(prefix, id, jkey, parent, pstate, at)
  local why = 'dependency ' .. parent .. ' failed'
  if pstate == 'cancelled' then why = 'dependency ' .. parent .. ' was cancelled' end
  redis.call('ZREM', prefix .. 'waiting', id)
  redis.call('HSET', jkey, 'state', 'dead', 'dead_reason', why, 'finished_at', at)
  redis.call('ZADD', prefix .. 'dead', at, id)
  add_history(prefix, id, 'dead', at, {reason = why})
  job_died(prefix, id, why, at)
  count(prefix, 'dead', at)
  finish(prefix, id, -1, at)
end

-- Job `parent` ended in `pstate`: each job waiting on it counts it, and is released
-- when it was the last; or, when it did not succeed, goes to dead (unless it was
-- enqueued with allow_failure, which counts any end).
local function release_dependents(prefix, parent, pstate, at)
  local dkey = job_key(prefix, parent) .. ':dependents'
  local kids = redis.call('SMEMBERS', dkey)
  redis.call('DEL', dkey)
  redis.call('HDEL', job_key(prefix, parent), 'dependents')
  for _, cid in ipairs(kids) do
    local ckey = job_key(prefix, cid)
    local f = redis.call('HMGET', ckey, 'state', 'allow_failure')
    if f[1] == 'waiting' then
      if pstate == 'succeeded' or f[2] then
        needed_by(job_key(prefix, parent), cid) -- it will read this parent's record
        add_history(prefix, cid, 'dependency ended', at, {parent = parent, state = pstate})
        if redis.call('HINCRBY', ckey, 'waiting_on', -1) <= 0 then
          release_waiting(prefix, cid, ckey, at)
        end
      else
        dependency_failed(prefix, cid, ckey, parent, pstate, at)
      end
    end
  end
end

-- A job ended (succeeded, dead or cancelled): its dependents and its batch learn of it.
-- A job that opened a batch counts in that batch (which, when done, ends it in its own
-- batch); else in its own batch.
links_ended = function(prefix, id, state, links, at)
  local batch, batch_queue, child_batch, dependents = links[1], links[2], links[3], links[4]
  local ok = state == 'succeeded'
  if dependents then release_dependents(prefix, id, state, at) end
  if child_batch then
    batch_count(prefix, child_batch, id, ok, at)
  elseif batch then
    member_ended(prefix, batch_queue, batch, id, ok, at)
  end
end
