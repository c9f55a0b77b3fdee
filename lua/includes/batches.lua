--[[
  batches: fan-out / fan-in.

  A batch is the hash `prefix .. "batch:" .. id` in the slot of the queue it was opened
  on: total, remaining, status, the callbacks' specs, and, when a running job opened it,
  `opener` and the opener's own batch (parent_queue, parent_batch). Its set `:ended`
  holds every member that ended (so a member that ends twice, a requeued dead one,
  counts once) and `:failed` those that did not succeed; `remaining` drops by one per
  new member in `:ended`, and the batch is done when it reaches 0. A batch opened by a
  job counts that job too (its ack, or its death if the ack never lands): a batch
  inside a batch's member ends that member, in the outer batch, only when it is done.
  A member on another queue cannot touch this slot: its end goes to its own queue's
  relay (`prefix .. "relay"`, a zset of JSON [batch queue, batch id, member, ok]) and
  the reaper delivers it (batch_relay.lua). Such a member may end before the batch is
  opened: `remaining` goes below 0 meanwhile, and opening adds the total.
]]
--@include includes/job
--@include includes/enqueue_job

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
  -- the callbacks' link to the batch, for their handlers' `current().parent_results()`;
  -- the batch lists them, so retention (trim.lua) keeps its members' records for them
  local ids = {}
  for _, spec in ipairs(specs) do
    spec['callback_of'] = bid
    ids[#ids + 1] = spec['id']
  end
  if #ids > 0 then redis.call('HSET', bkey, 'callbacks', cjson.encode(ids)) end
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
