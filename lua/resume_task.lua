--[[
  resume_task: untrip a task's circuit breaker (includes/breaker) and put its parked jobs
  back where they waited, at their place; or (ARGV[2] "") the reaper's pass: untrip every
  task whose cool-down has passed, and put back the parked jobs of every task no longer
  tripped. At most ARGV[3] jobs are moved a call; the rest on the next call (the tripped
  mark goes first, so a task's jobs are leased again from this call on, parked or not).

  KEYS[1]  forq:{q}:tripped     hash task -> JSON reason {pattern, jobs, ends, of,
                                window_ms, at, until} (includes/breaker)
  KEYS[2]  forq:{q}:limits      hash: field `tripped`, how many tasks are
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  the task to resume, or "" for the cool-down pass
  ARGV[3]  the most parked jobs to move back in this call

  Each task untripped writes a `resumed` event (no job's: its id is "", `by` operator
  or cooldown).
  Returns {untripped, moved, left, tripped}: how many tasks this call untripped, how many
    jobs it moved back to pending, how many parked jobs of untripped tasks wait for the
    next call, and the tasks still tripped as a flat list {task1, reason1, ...} (the
    supervisors log a task that tripped since their last pass).
  A parked job stays `pending` (its `parked` field names its task); one that left pending
  meanwhile (cancelled, expired before start) is dropped from the parked set, not moved.
  Transitions: none
  Events: resumed
]]
--@include includes/time
--@include includes/job
--@include includes/history
--@include includes/wake
--@include includes/pending
--@include includes/groups
--@include includes/events

local tripped_key, limits_key = KEYS[1], KEYS[2]
local prefix, only = ARGV[1], ARGV[2]
local budget = tonumber(ARGV[3]) or 1000
local parked_tasks = prefix .. 'parked_tasks'
if only == '' and redis.call('HLEN', tripped_key) == 0
    and redis.call('EXISTS', parked_tasks) == 0 then
  return {0, 0, 0, {}} -- the reaper's usual pass: two reads
end
local at = now_ms()
local untripped = 0
-- each task untripped on the event stream: `resumed`, no job's, `by` who resumed it
if only ~= '' then
  untripped = redis.call('HDEL', tripped_key, only)
  if untripped > 0 then emit(prefix, 'resumed', '', only, false, nil, {'by', 'operator'}) end
else
  local all = redis.call('HGETALL', tripped_key)
  for i = 1, #all, 2 do
    local ok, reason = pcall(cjson.decode, all[i + 1])
    local till = ok and type(reason) == 'table' and tonumber(reason['until']) or 0
    if not ok or (till > 0 and till <= at) then
      untripped = untripped + redis.call('HDEL', tripped_key, all[i])
      emit(prefix, 'resumed', '', all[i], false, nil, {'by', 'cooldown'})
    end
  end
end
local n = redis.call('HLEN', tripped_key)
if n > 0 then redis.call('HSET', limits_key, 'tripped', n) else redis.call('HDEL', limits_key, 'tripped') end

local tasks = {only}
if only == '' then tasks = redis.call('SMEMBERS', parked_tasks) end
local moved, left = 0, 0
for _, task in ipairs(tasks) do
  if redis.call('HEXISTS', tripped_key, task) == 0 then
    local key = prefix .. 'parked:' .. task
    local ids = {}
    if budget - moved > 0 then ids = redis.call('ZPOPMIN', key, budget - moved) end
    for i = 1, #ids, 2 do
      local id, score = ids[i], ids[i + 1]
      local jkey = job_key(prefix, id)
      local f = redis.call('HMGET', jkey, 'state', 'parked', 'group', 'score')
      -- rescheduled and promoted meanwhile, it may be waiting already: not twice
      local there = f[3] and redis.call('ZSCORE', group_pending_key(prefix, f[3]), id)
      if f[1] == 'pending' and f[2] and not there then
        redis.call('HDEL', jkey, 'parked')
        -- its record's score: a priority changed while it was parked (set_priority)
        to_pending(prefix, id, tonumber(f[4]) or score, f[3], at)
        add_history(prefix, id, 'unparked', at, {task = task})
        moved = moved + 1
      end
    end
    local rest = redis.call('ZCARD', key)
    if rest == 0 then redis.call('SREM', parked_tasks, task) end
    left = left + rest
  end
end
if moved > 0 or untripped > 0 then wake(prefix, 0) end
return {untripped, moved, left, redis.call('HGETALL', tripped_key)}
