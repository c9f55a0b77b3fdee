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
-- A finished job's links to other jobs, read with its end: its batch (id, the batch's
-- queue), a batch it opened from its handler, and whether jobs wait on it (depends_on).
-- `links_ended` (below) acts on them; nil fields mean no link, and cost nothing more.
local LINK_FIELDS = {'batch', 'batch_queue', 'child_batch', 'dependents'}
local links_ended -- defined at the end of this file: it enqueues and finishes jobs

local function finish(prefix, id, retention_ms, at, key, state, links)
  local jkey = job_key(prefix, id)
  if links == nil then
    links = redis.call('HMGET', jkey, 'state', unpack(LINK_FIELDS))
    state = table.remove(links, 1)
  end
  if links[1] or links[3] or links[4] then links_ended(prefix, id, state, links, at) end
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

-- A spec's links (batch membership, dependencies) as fields of its new job record.
local function add_link_fields(spec, fields)
  for _, f in ipairs({'batch', 'batch_queue', 'allow_failure'}) do
    if spec[f] ~= nil then
      table.insert(fields, f)
      table.insert(fields, tostring(spec[f]))
    end
  end
end

local function enqueue_one(prefix, queue, spec, at, hold)
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
  add_link_fields(spec, fields)
  if ukey then
    table.insert(fields, 'key')
    table.insert(fields, spec['key'])
    local unique_until = at + tonumber(spec['unique_ms'] or 0)
    table.insert(fields, 'unique_until')
    table.insert(fields, unique_until)
    redis.call('SET', ukey, id)
  end
  if hold then return {id, 'held', run_at}, fields end -- enqueue_waiting places it
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
local SUCCEED_FIELDS = {'attempts', 'result_ttl_ms', 'key', 'group', unpack(LINK_FIELDS)}

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
  finish(prefix, id, tonumber(f[i + 1]) or DEFAULT_RESULT_TTL_MS, at, f[i + 2] or false,
    'succeeded', {f[i + 4], f[i + 5], f[i + 6], f[i + 7]})
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

-- ---------------------------------------------------------------------------------------
-- Links between jobs: batches (fan-out / fan-in) and dependencies (depends_on).
--
-- A batch is the hash `prefix .. "batch:" .. id` in the slot of the queue it was opened
-- on: total, remaining, status, the callbacks' specs, and, when a running job opened it,
-- `opener` and the opener's own batch (parent_queue, parent_batch). Its set `:ended`
-- holds every member that ended (so a member that ends twice, a requeued dead one,
-- counts once) and `:failed` those that did not succeed; `remaining` drops by one per
-- new member in `:ended`, and the batch is done when it reaches 0. A batch opened by a
-- job counts that job too (its ack, or its death if the ack never lands): a batch
-- inside a batch's member ends that member, in the outer batch, only when it is done.
-- A member on another queue cannot touch this slot: its end goes to its own queue's
-- relay (`prefix .. "relay"`, a zset of JSON [batch queue, batch id, member, ok]) and
-- the reaper delivers it (batch_relay.lua). Such a member may end before the batch is
-- opened: `remaining` goes below 0 meanwhile, and opening adds the total.

local BATCH_KEEP_MS = DEFAULT_RESULT_TTL_MS -- a finished batch's record lives this long

-- The prefix of `queue` from a prefix of the same deployment ("forq:{q}:").
local function queue_prefix(prefix, queue)
  return string.sub(prefix, 1, string.find(prefix, '{', 1, true)) .. queue .. '}:'
end

-- The queue name a prefix stands for.
local function prefix_queue(prefix)
  return string.match(prefix, '{(.*)}')
end

local function batch_key(prefix, bid)
  return prefix .. 'batch:' .. bid
end

local member_ended

-- Every member of batch `bid` (in this slot) ended: the callbacks are enqueued, exactly
-- once (on_success only when none failed), then the batch's own parent batch is told.
local function batch_done(bprefix, bid, at)
  local bkey = batch_key(bprefix, bid)
  local r = redis.call('HMGET', bkey, 'on_success', 'on_complete', 'parent_queue',
    'parent_batch', 'opener')
  local failed = redis.call('SCARD', bkey .. ':failed')
  local ok = failed == 0
  redis.call('HSET', bkey, 'status', ok and 'succeeded' or 'failed', 'finished_at', at,
    'failed', failed)
  local specs = {}
  if r[1] and ok then specs[#specs + 1] = cjson.decode(r[1]) end
  if r[2] then specs[#specs + 1] = cjson.decode(r[2]) end
  if #specs > 0 then enqueue_followups(bprefix, prefix_queue(bprefix), nil, specs, at) end
  for _, suffix in ipairs({'', ':ended', ':failed', ':members'}) do
    redis.call('PEXPIRE', bkey .. suffix, BATCH_KEEP_MS)
  end
  if r[3] then member_ended(bprefix, r[3], r[4], r[5], ok, at) end
end

-- Member `member` of batch `bid`, in this slot, ended (`ok`: it succeeded). Returns
-- true when this counted it (false: it had been counted before).
local function batch_count(bprefix, bid, member, ok, at)
  local bkey = batch_key(bprefix, bid)
  if redis.call('SADD', bkey .. ':ended', member) == 0 then return false end
  if not ok then redis.call('SADD', bkey .. ':failed', member) end
  -- below 0 until the batch is opened, so only an opened batch reaches 0
  if redis.call('HINCRBY', bkey, 'remaining', -1) == 0 then batch_done(bprefix, bid, at) end
  return true
end

-- Member `member` of batch `bid` on queue `bqueue` ended: counted here when the batch
-- lives in this slot, else put in this queue's relay for the reaper to deliver.
member_ended = function(prefix, bqueue, bid, member, ok, at)
  local bprefix = queue_prefix(prefix, bqueue)
  if bprefix == prefix then return batch_count(bprefix, bid, member, ok, at) end
  redis.call('ZADD', prefix .. 'relay', at, cjson.encode({bqueue, bid, member, ok and 1 or 0}))
  return false
end

-- Open batch `bid` in this slot: `record` is {total, on_success, on_complete, members}
-- (members: a list of [queue, id]); `opener` the running job that opens it (or nil),
-- whose own batch becomes this one's parent. Returns false when it exists already.
local function batch_open(prefix, bid, record, opener, at)
  local bkey = batch_key(prefix, bid)
  if redis.call('HEXISTS', bkey, 'total') == 1 then return false end
  local total = tonumber(record['total'])
  local fields = {'id', bid, 'queue', prefix_queue(prefix), 'total', total,
    'created_at', at, 'status', 'open'}
  for _, name in ipairs({'on_success', 'on_complete'}) do
    if record[name] then
      fields[#fields + 1] = name
      fields[#fields + 1] = cjson.encode(record[name])
    end
  end
  local count_opener = 0
  if opener then
    count_opener = 1
    local okey = job_key(prefix, opener)
    local p = redis.call('HMGET', okey, 'batch', 'batch_queue')
    fields[#fields + 1] = 'opener'
    fields[#fields + 1] = opener
    if p[1] then
      fields[#fields + 1] = 'parent_batch'
      fields[#fields + 1] = p[1]
      fields[#fields + 1] = 'parent_queue'
      fields[#fields + 1] = p[2]
    end
    redis.call('HSET', okey, 'child_batch', bid)
  end
  redis.call('HSET', bkey, unpack(fields))
  local members = record['members'] or {}
  for start = 1, #members, 1000 do
    local chunk = {}
    for k = start, math.min(#members, start + 999) do chunk[#chunk + 1] = cjson.encode(members[k]) end
    redis.call('RPUSH', bkey .. ':members', unpack(chunk))
  end
  if redis.call('HINCRBY', bkey, 'remaining', total + count_opener) == 0 then
    batch_done(prefix, bid, at)
  end
  return true
end

-- A waiting job whose parents all ended: to pending (or scheduled, if its delay is not
-- over yet). Returns the state it is in now.
local function release_waiting(prefix, id, jkey, at)
  redis.call('ZREM', prefix .. 'waiting', id)
  local f = redis.call('HMGET', jkey, 'run_at', 'priority', 'group')
  local run_at = tonumber(f[1]) or at
  local state = 'pending'
  if run_at > at then
    state = 'scheduled'
    redis.call('HSET', jkey, 'state', 'scheduled')
    redis.call('ZADD', prefix .. 'scheduled', run_at, id)
    wake(prefix, run_at)
  else
    local score = pending_score(prefix, tonumber(f[2]) or 0)
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

-- The ids in `spec.depends_on` that no job has, given the ids enqueued before it in the
-- same call (`earlier`). Returns the first unknown id, or nil.
local function unknown_parent(prefix, spec, earlier)
  for _, pid in ipairs(spec['depends_on'] or {}) do
    if not earlier[pid] and redis.call('EXISTS', job_key(prefix, pid)) == 0 then
      return pid
    end
  end
  return nil
end

-- The job specs ARGV[first..] (JSON), decoded. A dependency on an unknown job refuses
-- the whole call before anything is written: then nil and the error reply to return.
local function decode_specs(prefix, queue, first)
  local specs, earlier = {}, {}
  for i = first, #ARGV do
    local spec = cjson.decode(ARGV[i])
    local unknown = unknown_parent(prefix, spec, earlier)
    if unknown then
      return nil, redis.error_reply('forq: depends_on of job ' .. tostring(spec['id']) ..
        ': no job ' .. unknown .. ' in queue ' .. queue)
    end
    earlier[spec['id']] = true
    specs[#specs + 1] = spec
  end
  return specs
end

-- Enqueue a job with depends_on (ids of jobs of this queue): `waiting` until they end.
-- A parent that succeeded already counts as done; one that is dead or cancelled sends
-- it to dead at once (or counts as done with allow_failure). Returns as enqueue_one,
-- with the statuses "waiting" and "dead" besides.
local function enqueue_waiting(prefix, queue, spec, at)
  local r, fields = enqueue_one(prefix, queue, spec, at, true)
  if r[2] ~= 'held' then return r end
  local id, run_at = r[1], r[3]
  local jkey = job_key(prefix, id)
  local waiting_on, failed, fstate = 0, nil, nil
  local seen = {}
  for _, pid in ipairs(spec['depends_on']) do
    if not seen[pid] then
      seen[pid] = true
      local pkey = job_key(prefix, pid)
      local st = redis.call('HGET', pkey, 'state')
      if st == 'dead' or st == 'cancelled' then
        if not spec['allow_failure'] and not failed then failed, fstate = pid, st end
      elseif st and st ~= 'succeeded' then
        redis.call('SADD', pkey .. ':dependents', id)
        redis.call('HSET', pkey, 'dependents', 1)
        waiting_on = waiting_on + 1
      end
    end
  end
  local deps = cjson.encode(spec['depends_on'])
  for _, v in ipairs({'state', 'waiting', 'depends_on', deps, 'waiting_on', waiting_on}) do
    fields[#fields + 1] = v
  end
  redis.call('HSET', jkey, unpack(fields))
  redis.call('ZADD', prefix .. 'waiting', at, id)
  if spec['group'] then redis.call('HSET', prefix .. 'limits', 'grouped', 1) end
  local extra = {event = 'enqueued', at = at, depends_on = spec['depends_on']}
  if spec['parent'] then extra['parent'] = spec['parent'] end
  redis.call('RPUSH', jkey .. ':history', cjson.encode(extra))
  if failed then
    dependency_failed(prefix, id, jkey, failed, fstate, at)
    return {id, 'dead', run_at}
  end
  if waiting_on == 0 then return {id, release_waiting(prefix, id, jkey, at), run_at} end
  return {id, 'waiting', run_at}
end
