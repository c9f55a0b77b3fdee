--[[
  fencing: the check every lease holder's transition starts with.
]]

-- Fencing, the check every lease holder's transition starts with: the job's fields
-- `state`, `token` and then `...`, or nil when it is not active under `token` (a stale
-- holder: the caller answers "lost" and changes nothing).
local function held(jkey, token, ...)
  local f = redis.call('HMGET', jkey, 'state', 'token', ...)
  if f[1] ~= 'active' or f[2] ~= token then return nil end
  return f
end
