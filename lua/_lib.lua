--[[
  Shared helpers, pasted at the top of every script that says `--@include _lib`.
  Redis runs each script atomically, so these helpers never see a half-made change.

  Conventions used by every script:
    * `prefix` is "forq:{queue}:"; a job lives in `prefix .. "job:" .. id` (a hash)
      and its history in `prefix .. "job:" .. id .. ":history"` (a capped list).
    * All times are milliseconds from Redis TIME, never from a client clock.
]]

local HISTORY_CAP = 100
local FINISHED_CAP = 10000 -- the "recently finished" index keeps this many newest ids
local MINUTE_KEEP_MS = 3660000 -- per-minute counts live an hour: the dashboard's rate chart
local PRIORITY_SPAN = 4398046511104 -- 2^42: pending score = -priority * 2^42 + seq

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function job_key(prefix, id)
  return prefix .. 'job:' .. id
end

-- Append one encoded entry to a job's history. RPUSH answers the length: trim only when
-- over the cap (a retried or reclaimed job), not on every entry of the common path.
local function push_history(prefix, id, entry)
  local hkey = job_key(prefix, id) .. ':history'
  if redis.call('RPUSH', hkey, entry) > HISTORY_CAP then
    redis.call('LTRIM', hkey, -HISTORY_CAP, -1)
  end
end

-- Append one entry to a job's history: event name, time (ms), and any extra fields.
local function add_history(prefix, id, event, at, extra)
  local entry = extra or {}
  entry['event'] = event
  entry['at'] = at
  push_history(prefix, id, cjson.encode(entry))
end

-- Integer field of a job hash, or `default` when unset.
-- Fencing, the check every lease holder's transition starts with: the job's fields
-- `state`, `token` and then `...`, or nil when it is not active under `token` (a stale
-- holder: the caller answers "lost" and changes nothing).
local function held(jkey, token, ...)
  local f = redis.call('HMGET', jkey, 'state', 'token', ...)
  if f[1] ~= 'active' or f[2] ~= token then return nil end
  return f
end

-- The ids a dead-letter tool acts on: ARGV[3], ARGV[4], … or, with mode "all", the
-- oldest ARGV[3] of the dead set.
local function dead_ids(dead_key, mode)
  if mode == 'all' then
    return redis.call('ZRANGE', dead_key, 0, tonumber(ARGV[3]) - 1)
  end
  local ids = {}
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
  return ids
end

local function num_field(jkey, field, default)
  local v = redis.call('HGET', jkey, field)
  if v then return tonumber(v) end
  return default
end

-- The job policy: the limits (timeout_ms, max_attempts, max_crashes, backoff_*, ...) a
-- supervisor applies where the producer set none. Stored once per distinct policy, as
-- the hash `prefix .. "policy:" .. sha1(policy JSON)` with a field NAME for the default
-- and NAME:TASK for a task's own; a job names its policy in its `policy` field, set by
-- its first claim (so, as a producer's own limits, it never changes under the job).
local function policy_key(prefix, sha)
  return prefix .. 'policy:' .. sha
end

-- A job's limits, named by the keys of `defaults`, as numbers: the job's own field,
-- else its policy's (the task's, then the default), else the value in `defaults`.
-- One HMGET, two when the policy is read.
local function job_limits(prefix, jkey, defaults)
  local names = {}
  for name in pairs(defaults) do names[#names + 1] = name end
  local f = redis.call('HMGET', jkey, 'policy', 'task', unpack(names))
  local out, ask, missing = {}, {}, {}
  for i, name in ipairs(names) do
    out[name] = tonumber(f[i + 2])
    if out[name] == nil and f[1] then
      missing[#missing + 1] = name
      ask[#ask + 1] = name .. ':' .. tostring(f[2])
      ask[#ask + 1] = name
    end
  end
  if #missing > 0 then
    local p = redis.call('HMGET', policy_key(prefix, f[1]), unpack(ask))
    for k, name in ipairs(missing) do out[name] = tonumber(p[2 * k - 1] or p[2 * k]) end
  end
  for name, default in pairs(defaults) do
    if out[name] == nil then out[name] = default end
  end
  return out
end

local function pending_score(prefix, priority)
  local seq = redis.call('INCR', prefix .. 'seq')
  return -priority * PRIORITY_SPAN + seq
end

-- Bump the per-queue totals and the per-minute window used by `forq stats` by n (1).
local function count(prefix, field, at, n)
  n = n or 1
  redis.call('HINCRBY', prefix .. 'stats', field, n)
  local mkey = prefix .. 'minute:' .. math.floor(at / 60000)
  -- the window's expiry is set by the field's first count in that minute, not by each
  -- count (MINUTE_KEEP_MS from then still outlives the minute)
  if redis.call('HINCRBY', mkey, field, n) == n then
    redis.call('PEXPIRE', mkey, MINUTE_KEEP_MS)
  end
end

-- Tell waiting supervisors there is work: "0" means pending now, otherwise the due time.
local function wake(prefix, due)
  redis.call('PUBLISH', prefix .. 'wake', tostring(due))
end

--@include _groups

-- A job reached succeeded, dead or cancelled: free its idempotency key (or keep it
-- until `unique_until`), start the record's retention clock, and list it in the capped
-- "recently finished" index (zset by finish time; two commands, O(log n) each). `key` is
-- the job's idempotency key when the caller has read it already (false: it has none).
local function finish(prefix, id, retention_ms, at, key)
  local jkey = job_key(prefix, id)
  if retention_ms ~= 0 then
    local fkey = prefix .. 'finished'
    redis.call('ZADD', fkey, at, id)
    redis.call('ZREMRANGEBYRANK', fkey, 0, -FINISHED_CAP - 1)
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
      redis.call('DEL', jkey, jkey .. ':history')
    else
      redis.call('PEXPIRE', jkey, retention_ms)
      redis.call('PEXPIRE', jkey .. ':history', retention_ms)
    end
  end
end

local DEFAULT_RESULT_TTL_MS = 86400000

-- Create one job from a decoded spec. Returns {id, status}; status is
-- "pending", "scheduled" or "duplicate" (then id is the live job holding the key,
-- or the same id when a job with this id already exists: follow-ups are idempotent).
local OPTION_FIELDS = {'timeout_ms', 'memory_limit', 'max_attempts', 'max_crashes',
  'result_ttl_ms', 'max_result_bytes', 'backoff_base_ms', 'backoff_factor',
  'backoff_max_ms', 'backoff_jitter', 'idempotent', 'parent', 'traceparent', 'group'}

local function enqueue_one(prefix, queue, spec, at)
  local id = spec['id']
  local jkey = job_key(prefix, id)
  if redis.call('EXISTS', jkey) == 1 then
    return {id, 'duplicate'}
  end
  local ukey = nil
  if spec['key'] then
    ukey = prefix .. 'unique:' .. spec['key']
    local holder = redis.call('GET', ukey)
    if holder then
      return {holder, 'duplicate'}
    end
  end
  local priority = tonumber(spec['priority'] or 0)
  local run_at = at
  if spec['run_at_ms'] then
    run_at = tonumber(spec['run_at_ms'])
  elseif spec['delay_ms'] then
    run_at = at + tonumber(spec['delay_ms'])
  end
  local fields = {'id', id, 'queue', queue, 'task', spec['task'],
    'args', spec['args'] or '[]', 'kwargs', spec['kwargs'] or '{}',
    'priority', priority, 'enqueued_at', at, 'run_at', run_at,
    'attempts', 0, 'crashes', 0}
  for _, f in ipairs(OPTION_FIELDS) do
    if spec[f] ~= nil then
      table.insert(fields, f)
      table.insert(fields, tostring(spec[f]))
    end
  end
  -- expiry before start (expires_in / expire_at): the job's `expire_at`, and an entry
  -- in the `expiring` index the reaper sweeps (claim drops it when the job starts)
  local expire_at = tonumber(spec['expire_at_ms'])
  if spec['expires_in_ms'] then expire_at = at + tonumber(spec['expires_in_ms']) end
  if expire_at then
    table.insert(fields, 'expire_at')
    table.insert(fields, expire_at)
    redis.call('ZADD', prefix .. 'expiring', expire_at, id)
  end
  if ukey then
    table.insert(fields, 'key')
    table.insert(fields, spec['key'])
    local unique_until = at + tonumber(spec['unique_ms'] or 0)
    table.insert(fields, 'unique_until')
    table.insert(fields, unique_until)
    redis.call('SET', ukey, id)
  end
  local status
  if run_at > at then
    status = 'scheduled'
    table.insert(fields, 'state')
    table.insert(fields, 'scheduled')
    redis.call('HSET', jkey, unpack(fields))
    redis.call('ZADD', prefix .. 'scheduled', run_at, id)
  else
    status = 'pending'
    local score = pending_score(prefix, priority)
    table.insert(fields, 'state')
    table.insert(fields, 'pending')
    table.insert(fields, 'score')
    table.insert(fields, score)
    redis.call('HSET', jkey, unpack(fields))
    if spec['group'] then
      redis.call('HSET', prefix .. 'limits', 'grouped', 1)
      group_add(prefix, spec['group'], id, score, at)
    else
      redis.call('ZADD', prefix .. 'pending', score, id)
    end
  end
  local extra = {}
  if spec['parent'] then extra['parent'] = spec['parent'] end
  if status == 'scheduled' then extra['run_at'] = run_at end
  -- the history list is new: a plain RPUSH, no trim (callers count the enqueues, once)
  extra['event'] = 'enqueued'
  extra['at'] = at
  redis.call('RPUSH', jkey .. ':history', cjson.encode(extra))
  return {id, status, run_at}
end

-- Move an active job to pending at its original place (crash reclaim or release);
-- a grouped job back in its group, its slot freed.
local function back_to_pending(prefix, id, jkey, at)
  local f = redis.call('HMGET', jkey, 'score', 'priority', 'group')
  local score = tonumber(f[1])
  if not score then
    score = pending_score(prefix, tonumber(f[2]) or 0)
    redis.call('HSET', jkey, 'score', score)
  end
  redis.call('ZREM', prefix .. 'active', id)
  redis.call('HSET', jkey, 'state', 'pending')
  redis.call('HDEL', jkey, 'owner', 'token', 'lease_deadline', 'cancel_requested')
  if f[3] then
    redis.call('ZADD', group_pending_key(prefix, f[3]), score, id)
    redis.call('INCR', prefix .. 'groups:pending')
    group_release(prefix, f[3], at or now_ms())
  else
    redis.call('ZADD', prefix .. 'pending', score, id)
  end
end

-- A job becomes pending (again) with `score`: in `pending`, or in its group.
local function to_pending(prefix, id, score, group, at)
  if group then
    group_add(prefix, group, id, score, at)
  else
    redis.call('ZADD', prefix .. 'pending', score, id)
  end
end

-- The fields `succeed` needs, in this order; ack reads them with its token check.
local SUCCEED_FIELDS = {'attempts', 'result_ttl_ms', 'key', 'group'}

-- Mark an active job succeeded (used by ack, and by claim/reclaim for an idempotent
-- job whose completion the parent had already recorded). `f` holds SUCCEED_FIELDS'
-- values when the caller has read them (from index `i`), else nil; `batched`: the
-- caller removes the job from `active` and counts the success, for a whole batch at once.
local function succeed(prefix, id, jkey, result, at, source, f, i, batched)
  if f == nil then
    f, i = redis.call('HMGET', jkey, unpack(SUCCEED_FIELDS)), 1
  end
  if not batched then redis.call('ZREM', prefix .. 'active', id) end
  redis.call('HSET', jkey, 'state', 'succeeded', 'finished_at', at, 'result', result,
    'attempts', (tonumber(f[i]) or 0) + 1)
  redis.call('HDEL', jkey, 'owner', 'token', 'lease_deadline', 'cancel_requested', 'error_pending')
  if source then
    add_history(prefix, id, 'succeeded', at, {source = source})
  else
    push_history(prefix, id, '{"event":"succeeded","at":' .. at .. '}')
  end
  if not batched then count(prefix, 'succeeded', at) end
  if f[i + 3] then group_release(prefix, f[i + 3], at) end
  finish(prefix, id, tonumber(f[i + 1]) or DEFAULT_RESULT_TTL_MS, at, f[i + 2] or false)
end

-- Enqueue a finished job's follow-ups (decoded specs) in its own queue, linked to it.
-- Their ids are deterministic, so any that exist already are left alone. Returns how
-- many were added.
local function enqueue_followups(prefix, queue, parent, specs, at)
  local added = 0
  for _, spec in ipairs(specs) do
    spec['parent'] = parent
    local r = enqueue_one(prefix, queue, spec, at)
    if r[2] ~= 'duplicate' then
      wake(prefix, r[2] == 'pending' and 0 or r[3])
      added = added + 1
    end
  end
  if added > 0 then count(prefix, 'enqueued', at, added) end
  return added
end

-- An idempotent job whose completion the parent recorded (`done` is the recorded
-- result) but whose ack never landed: succeed it without running it again, and enqueue
-- the same-queue follow-ups recorded with the completion, which that ack would have
-- enqueued.
local function succeed_recorded(prefix, id, jkey, done, at)
  local queue = redis.call('HGET', jkey, 'queue')
  succeed(prefix, id, jkey, done, at, 'completion recorded before')
  local raw = redis.call('GET', prefix .. 'done-followups:' .. id)
  if raw then
    enqueue_followups(prefix, queue, id, cjson.decode(raw), at)
  end
end

-- An active job left `active`. When a global max_in_flight may have held other
-- supervisors back, wake them so they claim the freed slot now instead of polling.
local function slot_freed(prefix)
  if redis.call('HEXISTS', prefix .. 'limits', 'max_in_flight') == 1
      and (redis.call('ZCARD', prefix .. 'pending') > 0
           or redis.call('ZCARD', prefix .. 'groups:ready') > 0) then
    wake(prefix, 0)
  end
end

-- An active job whose cancel was requested (`forq cancel`) and whose lease ends some
-- other way before its supervisor acted on it (a crash, a drain's release, a failure)
-- finishes as cancelled: a requested cancel is never undone by a rerun or a retry.
local function cancel_active(prefix, id, jkey, at, reason)
  redis.call('ZREM', prefix .. 'active', id)
  local group = redis.call('HGET', jkey, 'group')
  if group then group_release(prefix, group, at) end
  redis.call('HSET', jkey, 'state', 'cancelled', 'finished_at', at)
  redis.call('HDEL', jkey, 'owner', 'token', 'lease_deadline', 'cancel_requested', 'last_crash')
  add_history(prefix, id, 'cancelled', at, {reason = reason})
  count(prefix, 'cancelled', at)
  finish(prefix, id, num_field(jkey, 'result_ttl_ms', DEFAULT_RESULT_TTL_MS), at)
  slot_freed(prefix)
end

-- A job whose `expire_at` (enqueue's expires_in / expire_at) passed before it ever
-- started: dead, never run. The caller has taken it out of pending, scheduled or its
-- group's set (and released the group slot a claim took for it).
local EXPIRED_BEFORE_START = 'expired before start'
local function expire_unstarted(prefix, id, jkey, at, by)
  redis.call('ZREM', prefix .. 'expiring', id)
  redis.call('HSET', jkey, 'state', 'dead', 'dead_reason', EXPIRED_BEFORE_START,
    'finished_at', at)
  redis.call('ZADD', prefix .. 'dead', at, id)
  add_history(prefix, id, 'dead', at, {reason = EXPIRED_BEFORE_START, by = by})
  count(prefix, 'dead', at)
  count(prefix, 'expired', at)
  finish(prefix, id, -1, at)
end
