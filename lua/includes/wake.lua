--[[
  wake: tell supervisors blocked on forq:{q}:wake that there is work.
]]

-- Tell waiting supervisors there is work: "0" means pending now, otherwise the due time.
local function wake(prefix, due)
  redis.call('PUBLISH', prefix .. 'wake', tostring(due))
end

-- An active job left `active`. When a global max_in_flight may have held other
-- supervisors back, wake them so they claim the freed slot now instead of polling.
-- `max_in_flight`: the limits hash's field when the caller read it (false: absent),
-- nil to read it here.
local function slot_freed(prefix, max_in_flight)
  local limited = max_in_flight
  if limited == nil then
    limited = redis.call('HEXISTS', prefix .. 'limits', 'max_in_flight') == 1
  end
  if limited
      and (redis.call('ZCARD', prefix .. 'pending') > 0
           or redis.call('ZCARD', prefix .. 'groups:ready') > 0) then
    wake(prefix, 0)
  end
end
