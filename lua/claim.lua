--[[
  claim: promote due scheduled jobs, then lease up to N pending jobs to one supervisor.

  KEYS[1]  forq:{q}:pending     zset
  KEYS[2]  forq:{q}:scheduled   zset (run-at ms)
  KEYS[3]  forq:{q}:active      zset (lease deadline ms)
  KEYS[4]  forq:{q}:limits      hash: max_in_flight, rate (tokens per ms), burst, the
                                group limits (see includes/groups), paused (pause.lua:
                                lease nothing while it is set) and throttled_until
                                (includes/throttle: lease nothing before then), tripped
                                (includes/breaker: how many tasks are tripped), events
                                (includes/events)
  KEYS[5]  forq:{q}:bucket      hash: tokens, ts   (the global rate-limit token bucket)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  supervisor id (lease owner)
  ARGV[3]  N, the most jobs to lease
  ARGV[4]  lease ttl (ms)
  ARGV[5]  job policy JSON {"defaults": {...}, "tasks": {name: {...}}} or "": the
           limits for what the producer left unset. Stored once as the hash
           forq:{q}:policy:<sha1 of ARGV[5]> (see includes/policy); a job's first
           claim names it in the job's `policy` field and copies `result_ttl_ms` and
           the success's keep (keep_succeeded_ms, keep_succeeded_count, keep_history),
           which every ack needs, into the job, where it lacks them; fail and reclaim
           read the rest from it
  ARGV[6]  (optional) the handler code the jobs will run ("VERSION+FINGERPRINT", see
           supervisor/fork/fingerprint.py): set as each leased job's `code` field ("" when
           unknown) and, when not "", named in its `claimed` history entry

  Returns {next_due_ms, wait_ms, pending_left, held, now_ms, job1, job2, ...}
    next_due_ms   earliest scheduled run-at or group token (group rate), or -1
    wait_ms       >0 when the rate limit held jobs back: ms until the next token
    pending_left  pending jobs still waiting after this claim
    held          1 when max_in_flight held jobs back (a finishing job publishes a wake)
    now_ms        Redis time of this claim, to turn next_due_ms into a delay
    jobN          the leased job's record as a flat HGETALL list (includes token)
    (the policy's limits are not in it: the caller has the policy)
  Grouped jobs (see includes/groups) are taken from the ready groups, in score order with
  the head of `pending`: a group at its limit is not in the ready set, so it never
  holds back another group or an ungrouped job.
  A paused queue answers {-1, 0, pending, 0, now_ms} and changes nothing (no promotion
  either): resume.lua publishes the wake that makes supervisors claim again. A throttled
  one answers {throttled_until, 0, pending, 0, now_ms} alike: the supervisor claims
  again when the throttle ends (the first claim after it clears the field).
  Cost: O(log n) per job leased and per job promoted, whatever the backlog and however
  many groups (a queue that never had a grouped job pays nothing for them). Redis
  commands: about 8 per call and 3 per leased job (HGETALL, HSET, the history RPUSH);
  see bench/RESULTS.md.
  A job of a tripped task (includes/breaker; `tripped` > 0 in the limits) is not leased
  either: it is parked, still pending, in `parked:<task>` (its `parked` field set, its
  group's slot given back) until resume_task.lua puts it back; it takes its place in this
  claim, so wait_ms is 1 and the supervisor claims again at once. Parking costs O(log n)
  per job, like a lease: a tripped task never blocks the jobs behind it.
  A job whose expire_at (enqueue's expires_in) passed before its first start is not
  leased: it goes to dead with the reason "expired before start", and wait_ms is 1 so
  the supervisor claims again for the places it took.
  Transitions: scheduled -> pending, pending -> active, pending -> succeeded
  Transitions: pending -> dead
  Transitions: [*] -> pending, [*] -> scheduled
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  (a job that ends releases the jobs waiting on it, or sends them to dead; the end of
  a batch's last member enqueues the batch's callbacks)
  Events: started, succeeded, dead, enqueued
]]
--@include includes/time
--@include includes/job
--@include includes/history
--@include includes/policy
--@include includes/groups
--@include includes/pending
--@include includes/succeed
--@include includes/expire_unstarted
--@include includes/events

local pending_key, scheduled_key, active_key, limits_key, bucket_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local prefix, owner = ARGV[1], ARGV[2]
local want = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local code = ARGV[6]
local at = now_ms()
-- a job's keep fields its first claim copies from the policy (see step 3)
local SUCCESS_KEEP = {'keep_succeeded_ms', 'keep_succeeded_count', 'keep_history'}
-- the global limits, shared by every supervisor through this hash (used in step 2); a
-- paused queue leases nothing, known from the same HMGET; and the events switch
-- (includes/events), which each leased job's `started` event needs
local limits = redis.call('HMGET', limits_key, 'max_in_flight', 'rate', 'burst', 'grouped',
  'group_concurrency', 'group_rate', 'group_burst', 'paused', 'throttled_until',
  'group_throttles', 'tripped', 'events')
events_known(limits[12])
if limits[8] then return {-1, 0, redis.call('ZCARD', pending_key), 0, at} end
-- a throttled queue (includes/throttle) leases nothing until then: come back at its end
local throttled = tonumber(limits[9])
if throttled then
  if throttled > at then return {throttled, 0, redis.call('ZCARD', pending_key), 0, at} end
  redis.call('HDEL', limits_key, 'throttled_until')
end
local grouped = limits[4] ~= false
-- the tasks tripped by their circuit breaker (includes/breaker) and until when: read only
-- when some task is
local tripped = nil
if (tonumber(limits[11]) or 0) > 0 then
  tripped = {}
  local all = redis.call('HGETALL', prefix .. 'tripped')
  for i = 1, #all, 2 do
    local ok, reason = pcall(cjson.decode, all[i + 1])
    local till = ok and type(reason) == 'table' and tonumber(reason['until']) or 0
    if till == 0 or till > at then tripped[all[i]] = true end
  end
end
if grouped then group_limits(prefix, {limits[5], limits[6], limits[7], limits[10]}) end

-- 1. promote due scheduled jobs (bounded per call; the rest on the next call). The
-- earliest one is looked at first: nothing is due on most calls.
local function earliest()
  local first = redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES')
  if first[2] then return tonumber(first[2]) end
  return -1
end
local next_due = earliest()
if next_due >= 0 and next_due <= at then
  local due = redis.call('ZRANGEBYSCORE', scheduled_key, '-inf', at, 'LIMIT', 0, 1000)
  for _, id in ipairs(due) do
    local jkey = job_key(prefix, id)
    redis.call('ZREM', scheduled_key, id)
    local f = redis.call('HMGET', jkey, 'id', 'priority', 'group', 'lifo')
    if f[1] then
      local score = pending_score(prefix, tonumber(f[2]) or 0, f[4])
      redis.call('HSET', jkey, 'state', 'pending', 'score', score)
      to_pending(prefix, id, score, f[3], at)
      if f[3] then grouped = true end -- maybe the queue's first: take it in this claim
    end
  end
  next_due = earliest()
end
-- groups whose rate limit held them: back to ready once their token is due
local ready_key = prefix .. 'groups:ready'
local waiting = false -- some group waits for its rate: say when, at the end
if grouped then
  local wait_key = prefix .. 'groups:wait'
  local first = redis.call('ZRANGE', wait_key, 0, 0, 'WITHSCORES')
  waiting = first[1] ~= nil or group_cfg.rate ~= nil
  if first[2] and tonumber(first[2]) <= at then
    local due = redis.call('ZRANGEBYSCORE', wait_key, '-inf', at, 'LIMIT', 0, 1000)
    redis.call('ZREM', wait_key, unpack(due))
    for _, g in ipairs(due) do group_place(prefix, g, at) end
  end
end

-- 2. global limits (read above) and the rate limit's token bucket
local wait_ms = 0
local held = 0
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

-- 3. lease: one HGETALL and one HSET per job; the completion markers, the tokens and
-- the active-set entries are read or written once for the whole batch
local out = {}
local leased = 0
local expired = 0 -- jobs found expired before start (dead instead of leased)
local parked = 0 -- jobs of a tripped task, parked instead of leased
local pending_left = nil
local popped = {}
local popped_group = {} -- id -> group, for the jobs group_take took

-- Up to `want` jobs in score order from the head of `pending` and the ready groups'
-- heads (`rhead`, the first ready group). Each step is O(log n); a step that takes
-- nothing took a group out of `ready`, and the steps are capped all the same.
local function take_mixed(rhead)
  local out = {}
  local phead = redis.call('ZRANGE', pending_key, 0, 0, 'WITHSCORES')
  local steps = 2 * want + 16
  while #out < 2 * want and steps > 0 do
    steps = steps - 1
    if rhead[1] == nil then
      if phead[1] then
        for _, v in ipairs(redis.call('ZPOPMIN', pending_key, want - #out / 2)) do
          out[#out + 1] = v
        end
      end
      break
    end
    if phead[1] and tonumber(phead[2]) <= tonumber(rhead[2]) then
      redis.call('ZREM', pending_key, phead[1])
      out[#out + 1] = phead[1]
      out[#out + 1] = phead[2]
      phead = redis.call('ZRANGE', pending_key, 0, 0, 'WITHSCORES')
    else
      local id, score = group_take(prefix, rhead[1], at)
      if id then
        out[#out + 1] = id
        out[#out + 1] = score
        popped_group[id] = rhead[1]
      end
      rhead = redis.call('ZRANGE', ready_key, 0, 0, 'WITHSCORES')
    end
  end
  return out
end

if want > 0 then
  local rhead = {}
  if grouped then rhead = redis.call('ZRANGE', ready_key, 0, 0, 'WITHSCORES') end
  if rhead[1] then
    popped = take_mixed(rhead)
  else
    popped = redis.call('ZPOPMIN', pending_key, want)
  end
end
local count_popped = #popped / 2
-- fewer popped than asked: nothing is left pending (unless a follow-up lands below);
-- grouped jobs may still wait in full groups, so those are counted at the end
if want > 0 and count_popped < want and not grouped then pending_left = 0 end
if count_popped > 0 then
  local done_keys = {}
  for i = 1, count_popped do done_keys[i] = prefix .. 'done:' .. popped[2 * i - 1] end
  local dones = redis.call('MGET', unpack(done_keys))
  local token = redis.call('INCRBY', prefix .. 'token', count_popped) - count_popped
  local deadline = tostring(at + ttl)
  local at_s = tostring(at)
  local active = {}
  -- the policy: stored once, decoded once a call for the jobs' result_ttl_ms
  local policy, policy_sha = nil, nil
  if ARGV[5] ~= '' then
    policy_sha = redis.sha1hex(ARGV[5])
    policy = cjson.decode(ARGV[5])
    local pkey = policy_key(prefix, policy_sha)
    if redis.call('EXISTS', pkey) == 0 then
      local flat = {}
      for name, v in pairs(policy['defaults'] or {}) do
        flat[#flat + 1] = name
        flat[#flat + 1] = tostring(v)
      end
      for task, limits in pairs(policy['tasks'] or {}) do
        for name, v in pairs(limits) do
          flat[#flat + 1] = name .. ':' .. task
          flat[#flat + 1] = tostring(v)
        end
      end
      if #flat > 0 then redis.call('HSET', pkey, unpack(flat)) end
    end
  end
  -- a history entry without a table to encode: only the owner needs JSON quoting
  local claimed = '{"event":"claimed","at":' .. at_s .. ',"owner":' .. cjson.encode(owner)
  if code and code ~= '' then claimed = claimed .. ',"code":' .. cjson.encode(code) end
  claimed = claimed .. ',"token":'
  for i = 1, count_popped do
    local id = popped[2 * i - 1]
    local jkey = job_key(prefix, id)
    token = token + 1
    local record = redis.call('HGETALL', jkey)
    local fields = {}
    for j = 1, #record, 2 do fields[record[j]] = j end
    if fields['group'] and not popped_group[id] then
      group_occupy(prefix, record[fields['group'] + 1])
    end
    if #record == 0 then
      -- gone (purged or expired): nothing to lease, and its group's slot is free
      if popped_group[id] then group_release(prefix, popped_group[id], at) end
    elseif dones[i] then
      succeed_recorded(prefix, id, jkey, dones[i], at)
      pending_left = nil -- its follow-ups may be pending now
    elseif fields['expire_at'] and not fields['started_at']
        and tonumber(record[fields['expire_at'] + 1]) <= at then
      -- never started, and too late to: dead, its group slot (if any) given back
      if fields['group'] then group_release(prefix, record[fields['group'] + 1], at) end
      expire_unstarted(prefix, id, jkey, at, owner)
      expired = expired + 1
    elseif tripped and fields['task'] and tripped[record[fields['task'] + 1]] then
      -- its task is tripped: aside, still pending, at its place, until its task resumes
      local task = record[fields['task'] + 1]
      if fields['group'] then group_release(prefix, record[fields['group'] + 1], at) end
      redis.call('ZADD', prefix .. 'parked:' .. task, popped[2 * i], id)
      redis.call('SADD', prefix .. 'parked_tasks', task)
      redis.call('HSET', jkey, 'parked', task)
      add_history(prefix, id, 'parked', at, {task = task})
      parked = parked + 1
    else
      leased = leased + 1
      -- its first start: the expiry no longer applies, the sweep need not look at it
      if fields['expire_at'] and not fields['started_at'] then
        redis.call('ZREM', prefix .. 'expiring', id)
      end
      -- strings, so the reply's record reads as HGETALL's would
      local token_s = tostring(token)
      local set = {'state', 'active', 'owner', owner, 'token', token_s,
                   'lease_deadline', deadline, 'started_at', at_s}
      if code then
        set[#set + 1] = 'code'
        set[#set + 1] = code
      end
      -- parked once, then put back: no longer (a stale mark would confuse resume_task)
      if fields['parked'] then redis.call('HDEL', jkey, 'parked') end
      if policy and not fields['policy'] then
        set[#set + 1] = 'policy'
        set[#set + 1] = policy_sha
        local task = fields['task'] and record[fields['task'] + 1]
        if not fields['result_ttl_ms'] then
          local p = (policy['tasks'] and policy['tasks'][task]) or policy['defaults'] or {}
          if p['result_ttl_ms'] then
            set[#set + 1] = 'result_ttl_ms'
            set[#set + 1] = tostring(p['result_ttl_ms'])
          end
        end
        -- and how its success is kept (includes/retain: the task's, else the queue's),
        -- which its ack would read from the policy: the compact record drops them
        local own = (policy['tasks'] and policy['tasks'][task]) or {}
        for _, name in ipairs(SUCCESS_KEEP) do
          local v = own[name]
          if v == nil and policy['defaults'] then v = policy['defaults'][name] end
          if v ~= nil and not fields[name] then
            set[#set + 1] = name
            set[#set + 1] = tostring(v)
          end
        end
      end
      redis.call('HSET', jkey, unpack(set))
      -- the reply is the record as it now is: the one read, with what was just set
      for j = 1, #set, 2 do
        local at_j = fields[set[j]]
        if at_j then
          record[at_j + 1] = set[j + 1]
        else
          record[#record + 1] = set[j]
          record[#record + 1] = set[j + 1]
        end
      end
      active[#active + 1] = deadline
      active[#active + 1] = id
      push_history(prefix, id, claimed .. token_s .. '}')
      emit(prefix, 'started', id, fields['task'] and record[fields['task'] + 1] or false, owner)
      out[#out + 1] = record
    end
  end
  if #active > 0 then redis.call('ZADD', active_key, unpack(active)) end
end
if tokens ~= nil then
  redis.call('HSET', bucket_key, 'tokens', tostring(tokens - leased), 'ts', at)
end
-- a group this claim (or an earlier one) left waiting for its rate: when to come back
if waiting then
  local first = redis.call('ZRANGE', prefix .. 'groups:wait', 0, 0, 'WITHSCORES')
  if first[2] and (next_due < 0 or tonumber(first[2]) < next_due) then
    next_due = tonumber(first[2])
  end
end
if pending_left == nil then
  pending_left = redis.call('ZCARD', pending_key)
  if grouped then
    pending_left = pending_left + (tonumber(redis.call('GET', prefix .. 'groups:pending')) or 0)
  end
end
-- expired or parked jobs took places in this claim: claim again at once for the rest
if expired + parked > 0 and pending_left > 0 and wait_ms == 0 then wait_ms = 1 end

local result = {next_due, wait_ms, pending_left, held, at}
for _, job in ipairs(out) do result[#result + 1] = job end
return result
