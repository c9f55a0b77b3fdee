--[[
  expire_unstarted: a job's expiry before start (expires_in / expire_at) passed.
]]
--@include includes/history
--@include includes/counts
--@include includes/finish

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
