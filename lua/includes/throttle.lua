--[[
  throttle: a timed pause of a queue, or of one of its groups, that every claim honours
  (`current().throttle`, `Queue.throttle`). The queue's is the field `throttled_until`
  (Redis ms) of forq:{q}:limits, read by claim with the queue's other limits; a group's
  is its key `gthrottle:<group>` (includes/groups).
]]
--@include includes/wake
--@include includes/groups

-- Throttle the queue (`g` nil) or group `g` until `until_ms`; a throttle in force that
-- ends later stays. Tells the supervisors when it ends (they claim again then, without
-- polling). Returns the end in force.
local function throttle(prefix, g, until_ms, at)
  local ends = until_ms
  if g then
    ends = group_throttle(prefix, g, until_ms, at)
  else
    local key = prefix .. 'limits'
    local current = tonumber(redis.call('HGET', key, 'throttled_until'))
    if current and current >= until_ms then
      ends = current
    else
      redis.call('HSET', key, 'throttled_until', until_ms)
    end
  end
  wake(prefix, ends)
  return ends
end

-- Lift the queue's (`g` nil) or group `g`'s throttle, waking the supervisors. Returns
-- true when one was in force.
local function unthrottle(prefix, g, at)
  local lifted
  if g then
    lifted = group_unthrottle(prefix, g, at)
  else
    local key = prefix .. 'limits'
    local current = tonumber(redis.call('HGET', key, 'throttled_until'))
    redis.call('HDEL', key, 'throttled_until')
    lifted = current ~= nil and current > at
  end
  if lifted then wake(prefix, 0) end
  return lifted
end
