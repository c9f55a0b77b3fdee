--[[
  trim: retention. Delete the records of ended jobs (succeeded, dead) past their keep
  age or beyond their keep count (docs/operations/retention.md), or, for `forq purge`, the ids
  given. The reaper runs a pass for every served queue, bounded by ARGV[3]; concurrent
  passes are safe (each record is deleted by the first call to reach it). A pass also
  trims the "recently finished" index (forq:{q}:finished) to its newest 10,000, which a
  success leaves to it (includes/finish).

  KEYS[1]  forq:{q}:kept        set of the buckets "<state>:<count>"; each is the zset
                                forq:{q}:kept:<state>:<count> of the ended jobs sharing
                                that keep count, scored by the time their age runs out
  KEYS[2]  forq:{q}:dead        zset (the dead-letter set)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  mode: "pass" (the reaper's) or "ids" (purge: ARGV[4..] are "<state>:<id>")
  ARGV[3]  the most index entries to look at in this call (mode "pass")

  Never deletes a live job: only a record whose state is still the bucket's (a dead job
  requeued since is dropped from the index, not deleted); a record an idempotency key
  within its unique_for still names, that a job waiting on it (depends_on) has yet to
  read, or that its batch's callbacks may read (the batch, in this slot, is open or a
  callback has not ended) stays and is looked at again later (its entry moves to when
  that may end). A member of a batch on another queue (another slot) keeps its own keep.
  Returns {succeeded deleted, dead deleted, kept back, 1 when the budget ran out}.
  Cost: O(log n) per entry looked at, plus the readers of a record that has them (a
  batch member's: its batch's callbacks).
  Transitions: succeeded -> [*], dead -> [*]
]]
--@include includes/time
--@include includes/job

local RECHECK_MS = 60000 -- a record a waiting job still needs is looked at again after
local FINISHED_CAP = 10000 -- the "recently finished" index's newest kept (includes/finish)

local kept_key, dead_key = KEYS[1], KEYS[2]
local prefix, mode, budget = ARGV[1], ARGV[2], tonumber(ARGV[3]) or 0
local at = now_ms()
local out = {0, 0, 0, 0}

local function ended(jid)
  local st = redis.call('HGET', job_key(prefix, jid), 'state')
  return not st or st == 'succeeded' or st == 'dead' or st == 'cancelled'
end

-- Whether the callbacks of batch `bid` (on queue `bqueue`) may still read its members'
-- records (parents.lua): the batch is open, or a callback it enqueued has not ended. A
-- batch on another queue lives in another slot, which this script cannot read.
local function batch_reads(bid, bqueue)
  if bqueue and bqueue ~= string.match(prefix, '{(.*)}') then return false end
  local bkey = prefix .. 'batch:' .. bid
  local b = redis.call('HMGET', bkey, 'status', 'callbacks')
  if b[1] == 'open' then return true end
  for _, cid in ipairs(b[2] and cjson.decode(b[2]) or {}) do
    if not ended(cid) then return true end
  end
  return false
end

-- The record of `id`, indexed in `zkey` as `state`: deleted, kept back or dropped.
local function trim_one(zkey, id, state)
  local jkey = job_key(prefix, id)
  local f = redis.call('HMGET', jkey, 'state', 'key', 'unique_until', 'batch', 'batch_queue')
  if f[1] ~= state then -- gone (expired, purged) or requeued: only the entry goes
    if zkey then redis.call('ZREM', zkey, id) end
    return
  end
  local until_ms = tonumber(f[3]) or 0
  if f[2] and until_ms > at and redis.call('GET', prefix .. 'unique:' .. f[2]) == id then
    if zkey then redis.call('ZADD', zkey, until_ms, id) end
    out[3] = out[3] + 1
    return
  end
  local nkey = jkey .. ':needed_by'
  local needed = f[4] and batch_reads(f[4], f[5])
  if not needed then
    for _, kid in ipairs(redis.call('SMEMBERS', nkey)) do
      if not ended(kid) then
        needed = true
        break
      end
      redis.call('SREM', nkey, kid)
    end
  end
  if needed then
    if zkey then redis.call('ZADD', zkey, at + RECHECK_MS, id) end
    out[3] = out[3] + 1
    return
  end
  if zkey then redis.call('ZREM', zkey, id) end
  if state == 'dead' then
    redis.call('ZREM', dead_key, id)
    out[2] = out[2] + 1
  else
    out[1] = out[1] + 1
  end
  redis.call('ZREM', prefix .. 'finished', id)
  redis.call('DEL', jkey, jkey .. ':history', nkey, prefix .. 'done-followups:' .. id)
end

if mode == 'ids' then
  for i = 4, #ARGV do
    local state, id = string.match(ARGV[i], '^(%a+):(.+)$')
    if state == 'succeeded' or state == 'dead' then trim_one(nil, id, state) end
  end
  return out
end

-- the "recently finished" index back to its cap: a success does not trim it (includes/finish)
redis.call('ZREMRANGEBYRANK', prefix .. 'finished', 0, -FINISHED_CAP - 1)
local buckets = redis.call('SMEMBERS', kept_key)
table.sort(buckets)
for _, bucket in ipairs(buckets) do
  local state, count = string.match(bucket, '^(%a+):(%d+)$')
  local zkey = prefix .. 'kept:' .. bucket
  if budget > 0 then
    local old = redis.call('ZRANGEBYSCORE', zkey, '-inf', at, 'LIMIT', 0, budget)
    for _, id in ipairs(old) do trim_one(zkey, id, state) end
    budget = budget - #old
  end
  local excess = redis.call('ZCARD', zkey) - tonumber(count)
  if excess > 0 and budget > 0 then
    local n = math.min(excess, budget)
    for _, id in ipairs(redis.call('ZRANGE', zkey, 0, n - 1)) do trim_one(zkey, id, state) end
    budget = budget - n
  end
  if budget <= 0 then out[4] = 1 end
  if redis.call('EXISTS', zkey) == 0 then redis.call('SREM', kept_key, bucket) end
end
return out
