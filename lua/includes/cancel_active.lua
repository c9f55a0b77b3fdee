--[[
  cancel_active: a requested cancel wins over how a lease ended otherwise.
]]
--@include includes/job
--@include includes/history
--@include includes/counts
--@include includes/wake
--@include includes/groups
--@include includes/finish

-- An active job whose cancel was requested (`forq cancel`) and whose lease ends some
-- other way before its supervisor acted on it (a crash, a drain's release, a failure)
-- finishes as cancelled: a requested cancel is never undone by a rerun or a retry.
local function cancel_active(prefix, id, jkey, at, reason)
  redis.call('ZREM', prefix .. 'active', id)
  local group = redis.call('HGET', jkey, 'group')
  if group then group_release(prefix, group, at) end
  redis.call('HSET', jkey, 'state', 'cancelled', 'finished_at', at)
  redis.call('HDEL', jkey, 'owner', 'token', 'lease_deadline', 'cancel_requested', 'last_crash')
  add_history(prefix, id, 'cancelled', at, {reason = reason})
  count(prefix, 'cancelled', at)
  finish(prefix, id, num_field(jkey, 'result_ttl_ms', DEFAULT_RESULT_TTL_MS), at)
  slot_freed(prefix)
end
