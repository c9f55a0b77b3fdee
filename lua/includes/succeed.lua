--[[
  succeed: an active job's handler returned (ack), or its completion was recorded
  before its ack was lost (claim, reclaim).
]]
--@include includes/job
--@include includes/history
--@include includes/counts
--@include includes/groups
--@include includes/enqueue_job
--@include includes/finish
--@include includes/events
--@include includes/retain

-- The fields a compact succeeded record keeps besides its end (state, result, attempts,
-- finished_at), when its policy's keep_history is off: what a reader of its result
-- needs, what retention reads (its idempotency key, its links), and what the run was:
-- its cost (includes/cost: an earlier attempt's, or this one's from the caller) and the
-- code it ran.
local COMPACT_FIELDS = {'id', 'task', 'queue', 'enqueued_at', 'started_at', 'crashes', 'key',
  'unique_until', 'batch', 'batch_queue', 'parent', 'depends_on', 'callback_of', 'idempotent',
  'cost', 'code'}

-- The fields `succeed` needs, in this order; ack reads them with its token check.
-- The task and the lease's owner name the job's `succeeded` event (includes/events);
-- COMPACT_FIELDS follow (from index 15), read in the same HMGET.
local SUCCEED_FIELDS = {'attempts', 'result_ttl_ms', 'key', 'group', 'batch', 'batch_queue',
  'child_batch', 'dependents', 'policy', 'task', 'keep_succeeded_ms', 'keep_succeeded_count',
  'keep_history', 'owner'}
local COMPACT_AT = #SUCCEED_FIELDS
for _, name in ipairs(COMPACT_FIELDS) do SUCCEED_FIELDS[#SUCCEED_FIELDS + 1] = name end

-- Mark an active job succeeded (used by ack, and by claim/reclaim for an idempotent
-- job whose completion the parent had already recorded). `f` holds SUCCEED_FIELDS'
-- values when the caller has read them (from index `i`), else nil; `batched`: the
-- caller removes the job from `active` and counts the success, for a whole batch at once;
-- `extra`: nil or a flat list of more fields to write with the end (ack: the run's cost),
-- in the same HSET.
local function succeed(prefix, id, jkey, result, at, source, f, i, batched, extra)
  if f == nil then
    f, i = redis.call('HMGET', jkey, unpack(SUCCEED_FIELDS)), 1
  end
  emit(prefix, 'succeeded', id, f[i + 9], f[i + 13]) -- its task and the lease's owner
  if not batched then redis.call('ZREM', prefix .. 'active', id) end
  local keep = keep_of(prefix, 'succeeded', f[i + 8], f[i + 9], f, i + 10)
  local ended = {'state', 'succeeded', 'finished_at', at, 'result', result,
    'attempts', (tonumber(f[i]) or 0) + 1}
  if keep[3] == 0 then
    -- compact: written anew without its history, arguments, steps and lease, so a small
    -- record is a listpack again (a hash once past 64-byte values stays a hashtable)
    for k, name in ipairs(COMPACT_FIELDS) do
      local v = f[i + COMPACT_AT + k - 1]
      if v then
        ended[#ended + 1] = name
        ended[#ended + 1] = v
      end
    end
    if extra then for k = 1, #extra do ended[#ended + 1] = extra[k] end end
    redis.call('DEL', jkey, jkey .. ':history')
    redis.call('HSET', jkey, unpack(ended))
  else
    if extra then for k = 1, #extra do ended[#ended + 1] = extra[k] end end
    redis.call('HSET', jkey, unpack(ended))
    redis.call('HDEL', jkey, 'owner', 'token', 'lease_deadline', 'cancel_requested',
      'error_pending')
    if source then
      add_history(prefix, id, 'succeeded', at, {source = source})
    else
      push_history(prefix, id, '{"event":"succeeded","at":' .. at .. '}')
    end
  end
  if not batched then count(prefix, 'succeeded', at) end
  if f[i + 3] then group_release(prefix, f[i + 3], at) end
  finish(prefix, id, tonumber(f[i + 1]) or DEFAULT_RESULT_TTL_MS, at, f[i + 2] or false,
    'succeeded', {f[i + 4], f[i + 5], f[i + 6], f[i + 7]}, keep)
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
