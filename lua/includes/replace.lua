--[[
  replace: an enqueue that finds its idempotency key held (`key=` with `replace=True`,
  `debounce=` or `key_scope="queued"`; enqueue.lua only).

  `unique:<key>` names the job that holds the key (enqueue_job). By default (key_scope
  "live") it holds it from its enqueue to its end (and `unique_for` after), and a second
  enqueue with the key is a duplicate. With replace, a holder that has not started yet
  (pending, scheduled or waiting on its dependencies) takes the new call's arguments,
  and its new delay or run_at when the call gives one, in place: same id, same place in
  its queue unless its time moved. With key_scope "queued", the key covers the jobs
  that have not started: a holder that is running gives the key to the new job, so one
  runs while one more waits (BullMQ's keepLastIfActive, Hatchet's
  CANCEL_QUEUED_EXCEPT_NEWEST).
]]
--@include includes/job
--@include includes/history
--@include includes/wake
--@include includes/groups
--@include includes/pending
--@include includes/events

local QUEUED = {pending = true, scheduled = true, waiting = true}

-- Move the not yet started job `id` (its record's fields `f`: state, group, priority,
-- run_at, lifo) to `run_at`: scheduled if it is in the future, else pending (a waiting job only
-- notes it, for when it is released). Returns its state after.
local function move_to(prefix, id, jkey, f, run_at, at)
  local state, group = f[1], f[2]
  if state == 'scheduled' and run_at <= at then
    redis.call('ZREM', prefix .. 'scheduled', id)
    local score = pending_score(prefix, tonumber(f[3]) or 0, f[5])
    redis.call('HSET', jkey, 'state', 'pending', 'score', score)
    to_pending(prefix, id, score, group, at)
    wake(prefix, 0)
    return 'pending'
  elseif state == 'scheduled' then
    redis.call('ZADD', prefix .. 'scheduled', run_at, id)
    wake(prefix, run_at)
  elseif state == 'pending' and run_at > at then
    if group then
      group_remove_pending(prefix, group, id, at)
    else
      redis.call('ZREM', prefix .. 'pending', id)
    end
    redis.call('HSET', jkey, 'state', 'scheduled')
    redis.call('ZADD', prefix .. 'scheduled', run_at, id)
    wake(prefix, run_at)
    return 'scheduled'
  end
  return state
end

-- The enqueue of `spec`, which has a key, when the key is held: {id, "replaced", run_at}
-- when the holder took the spec's arguments (and time), else nil: then enqueue_one
-- goes on (a duplicate, or a new job when key_scope "queued" freed the key of a running
-- holder).
local function key_held(prefix, spec, at)
  local ukey = prefix .. 'unique:' .. spec['key']
  local holder = redis.call('GET', ukey)
  if not holder then return nil end
  local jkey = job_key(prefix, holder)
  local f = redis.call('HMGET', jkey, 'state', 'group', 'priority', 'run_at', 'lifo')
  if spec['replace'] and QUEUED[f[1]] then
    redis.call('HSET', jkey, 'args', spec['args'] or '[]', 'kwargs', spec['kwargs'] or '{}')
    local run_at = tonumber(f[4]) or at
    local entry = {}
    if spec['run_at_ms'] or spec['delay_ms'] then
      run_at = tonumber(spec['run_at_ms']) or at + tonumber(spec['delay_ms'])
      redis.call('HSET', jkey, 'run_at', run_at)
      entry['run_at'] = run_at
    end
    local state = move_to(prefix, holder, jkey, f, run_at, at)
    add_history(prefix, holder, 'replaced', at, entry)
    emit(prefix, 'replaced', holder, nil, nil, nil, {'state', state})
    return {holder, 'replaced', run_at}
  end
  -- the running holder keeps going, and ends without touching the key (finish frees
  -- it only while it names the job)
  if spec['key_scope'] == 'queued' and f[1] == 'active' then redis.call('DEL', ukey) end
  return nil
end
