--[[
  enqueue_job: create a job from a decoded spec (enqueue, batch, a finished job's
  follow-ups, a batch's callbacks).
]]
--@include includes/job
--@include includes/counts
--@include includes/wake
--@include includes/groups
--@include includes/pending
--@include includes/events

-- Create one job from a decoded spec. Returns {id, status}; status is
-- "pending", "scheduled" or "duplicate" (then id is the live job holding the key,
-- or the same id when a job with this id already exists: follow-ups are idempotent).
local OPTION_FIELDS = {'timeout_ms', 'memory_limit', 'max_attempts', 'max_crashes',
  'result_ttl_ms', 'max_result_bytes', 'backoff_base_ms', 'backoff_factor',
  'backoff_max_ms', 'backoff_jitter', 'idempotent', 'parent', 'traceparent', 'group', 'lifo',
  'max_snoozes', 'keep_succeeded_ms', 'keep_succeeded_count', 'keep_dead_ms',
  'keep_dead_count', 'keep_history'}

-- A spec's links (batch membership, dependencies) as fields of its new job record.
local function add_link_fields(spec, fields)
  for _, f in ipairs({'batch', 'batch_queue', 'allow_failure', 'callback_of'}) do
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
    -- enqueue.lua took the job's place in the queue's seq with the whole call's (`seq`)
    local score = pending_score(prefix, priority, spec['lifo'], spec['seq'])
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
  emit(prefix, 'enqueued', id, spec['task'], nil, nil, {'state', status})
  return {id, status, run_at}
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
