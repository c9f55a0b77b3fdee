--[[
  pending: where a job waits to be claimed, `pending` or its group's set, and its place.
]]
--@include includes/time
--@include includes/groups

-- pending score = -priority * 2^42 + seq: by priority, then first in first out. A lifo
-- job (enqueue's lifo=True, its record's `lifo` field) takes -priority * 2^42 - seq: the
-- head of its priority, the newest first. While seq < 2^41 (two trillion enqueues to one
-- queue) the lifo and fifo ranges of two priorities never meet; |priority| <= 1000 keeps
-- every score exact in a double. `seq`: one the caller took already (enqueue takes one
-- INCRBY for all the jobs of its call), or nil to take the next.
local PRIORITY_SPAN = 4398046511104 -- 2^42

local function pending_score(prefix, priority, lifo, seq)
  seq = seq or redis.call('INCR', prefix .. 'seq')
  if lifo == 1 or lifo == '1' then return -priority * PRIORITY_SPAN - seq end
  return -priority * PRIORITY_SPAN + seq
end

-- A job becomes pending (again) with `score`: in `pending`, or in its group.
local function to_pending(prefix, id, score, group, at)
  if group then
    group_add(prefix, group, id, score, at)
  else
    redis.call('ZADD', prefix .. 'pending', score, id)
  end
end

-- Move an active job to pending at its original place (crash reclaim or release);
-- a grouped job back in its group, its slot freed.
local function back_to_pending(prefix, id, jkey, at)
  local f = redis.call('HMGET', jkey, 'score', 'priority', 'group', 'lifo')
  local score = tonumber(f[1])
  if not score then
    score = pending_score(prefix, tonumber(f[2]) or 0, f[4])
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
