#!lua
--[[
  enqueue: create jobs in pending (due now) or scheduled (delayed).
  A flagged script (Redis 7): refused before it runs when Redis is out of memory, so
  a job is never half-written; the producer gets QueueFull.

  KEYS[1]  forq:{q}:pending     zset, score = -priority * 2^42 + seq
  KEYS[2]  forq:{q}:scheduled   zset, score = run-at (ms)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  queue name
  ARGV[3..] six entries per job: id, task, args (JSON text), kwargs (JSON text), priority
           (an integer, as text), and its other options: "" for none (a plain job: pending
           now, written by the short path below), else one JSON object of them:
           {delay_ms | run_at_ms, key, unique_ms, and optional per-job limits: timeout_ms,
            memory_limit, max_attempts, max_crashes, result_ttl_ms, max_result_bytes,
            backoff_base_ms, backoff_factor, backoff_max_ms, backoff_jitter, idempotent,
            parent, traceparent (W3C trace context of the producer's span), lifo, group,
            expires_in_ms | expire_at_ms (expiry before start: the job's `expire_at`,
            indexed in forq:{q}:expiring; see sweep_expired.lua),
            depends_on (ids of jobs of this queue, enqueued before it: it waits until
            they end), allow_failure, batch and batch_queue (its batch, see batch.lua),
            replace and key_scope (a held key: see includes/replace)}

  Returns a flat list of the jobs that did not become pending under the id they were
  sent with (a job not in it did: most often every one), four entries each, in order: its
  place in the call (1 for the first), id, status, run_at.
    status "pending" | "scheduled" | "duplicate" (id is then the live job that holds
    the idempotency key, or the same id when that job id already exists) | "replaced"
    (id is the job that held the key and took this call's arguments, run_at its run-at) |
    "waiting" (on its depends_on) | "dead" (a dependency had failed already).
  An error reply "forq: depends_on of job X: no job Y in queue Q" when a dependency is
  unknown: then nothing of the call was written.
  Publishes on forq:{q}:wake so waiting supervisors claim without polling.
  Transitions: [*] -> pending, [*] -> scheduled, [*] -> waiting
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  Transitions: pending -> scheduled, scheduled -> pending, scheduled -> scheduled
  (a job with depends_on waits, unless its parents ended already: then it is released,
  or dead at once when one failed; a replace moves the job that holds the key when it
  gives a new delay or run_at)
  Events: enqueued, replaced, dead
]]
--@include includes/time
--@include includes/counts
--@include includes/wake
--@include includes/job
--@include includes/pending
--@include includes/events
--@include includes/enqueue_job
--@include includes/depends_on
--@include includes/replace

-- Why the short path: a plain job (most of an enqueue_many) costs Redis about half of
-- what enqueue_one's general path does (bench/RESULTS.md, "Findings X"): no JSON to
-- decode, one INCRBY of the queue's seq and one ZADD for the whole call, and its numbers
-- turned into text once a call (a Lua number given to redis.call is formatted anew on
-- every call). It writes the same record, history, event and index entry.
local STRIDE = 6
local prefix, queue = ARGV[1], ARGV[2]
local n = (#ARGV - 2) / STRIDE
if n ~= math.floor(n) then
  return redis.error_reply('forq: enqueue takes ' .. STRIDE .. ' arguments per job, got ' ..
    (#ARGV - 2))
end

-- the jobs with options, decoded (by their place in the call); a dependency on an unknown
-- job refuses the whole call, before anything is written
local specs, with_parents = {}, false
for k = 1, n do
  local i = 3 + (k - 1) * STRIDE
  if ARGV[i + 5] ~= '' then
    local spec = cjson.decode(ARGV[i + 5])
    spec['id'], spec['task'], spec['args'], spec['kwargs'] = ARGV[i], ARGV[i + 1], ARGV[i + 2],
      ARGV[i + 3]
    spec['priority'] = tonumber(ARGV[i + 4])
    specs[k] = spec
    if spec['depends_on'] then with_parents = true end
  end
end
if with_parents then
  local earlier = {}
  for k = 1, n do
    local spec = specs[k]
    if spec then
      local unknown = unknown_parent(prefix, spec, earlier)
      if unknown then
        return redis.error_reply('forq: depends_on of job ' .. tostring(spec['id']) ..
          ': no job ' .. unknown .. ' in queue ' .. queue)
      end
    end
    earlier[ARGV[3 + (k - 1) * STRIDE]] = true
  end
end

local at = now_ms()
local at_text = tostring(at) -- 13 digits: exact in Lua's %.14g
local seq = redis.call('INCRBY', prefix .. 'seq', n) - n -- one place per job, in order
local keep = events_on(prefix) and tostring(events_keep)
local enqueued_entry = cjson.encode({event = 'enqueued', at = at}) -- a plain job's history
local pending_key, events_key = prefix .. 'pending', prefix .. 'events'
local ranked = {} -- score, id of the plain jobs not yet in `pending`
local out = {}
local earliest = nil
local added = 0

local function flush_ranked()
  if #ranked > 0 then
    redis.call('ZADD', pending_key, unpack(ranked))
    ranked = {}
  end
end

for k = 1, n do
  local i = 3 + (k - 1) * STRIDE
  seq = seq + 1
  local spec, r = specs[k], nil
  if spec == nil then -- a plain job: pending now
    local id, task = ARGV[i], ARGV[i + 1]
    local jkey = job_key(prefix, id)
    if redis.call('EXISTS', jkey) == 1 then
      r = {id, 'duplicate'}
    else
      -- string.format %d: exact to 2^63, where tostring's %.14g rounds a priority's score
      local score = string.format('%d', pending_score(prefix, tonumber(ARGV[i + 4]), nil, seq))
      redis.call('HSET', jkey, 'id', id, 'queue', queue, 'task', task, 'args', ARGV[i + 2],
        'kwargs', ARGV[i + 3], 'priority', ARGV[i + 4], 'enqueued_at', at_text,
        'run_at', at_text, 'attempts', '0', 'crashes', '0', 'state', 'pending',
        'score', score)
      ranked[#ranked + 1] = score
      ranked[#ranked + 1] = id
      if #ranked >= 1000 then flush_ranked() end -- unpack's stack stays small
      redis.call('RPUSH', jkey .. ':history', enqueued_entry)
      if keep then
        redis.call('XADD', events_key, 'MAXLEN', '~', keep, '*', 'event', 'enqueued', 'id', id,
          'task', task, 'state', 'pending')
      end
      r = nil -- pending under its own id: not in the reply
    end
  else
    flush_ranked() -- what it does sees every plain job before it in `pending`
    spec['seq'] = seq
    r = spec['key'] and key_held(prefix, spec, at)
    if r then -- replaced in place (it woke the supervisors itself), nothing enqueued
    elseif spec['depends_on'] then r = enqueue_waiting(prefix, queue, spec, at)
    else r = enqueue_one(prefix, queue, spec, at) end
  end
  if r == nil then
    earliest = 0
    added = added + 1
  else
    if r[2] ~= 'pending' or r[1] ~= ARGV[i] then
      out[#out + 1] = k
      out[#out + 1] = r[1]
      out[#out + 1] = r[2]
      out[#out + 1] = r[3] or 0
    end
    if r[2] ~= 'duplicate' and r[2] ~= 'replaced' then
      local due = r[2] == 'pending' and 0 or r[3]
      if earliest == nil or due < earliest then earliest = due end
      added = added + 1
    end
  end
end
flush_ranked()
if added > 0 then count(prefix, 'enqueued', at, added) end
if earliest ~= nil then wake(prefix, earliest) end
return out
