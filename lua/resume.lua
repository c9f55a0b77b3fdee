--[[
  resume: let supervisors claim from a paused queue again, and wake them at once (a
  "0" on forq:{q}:wake, the message enqueue sends) instead of leaving them to poll.

  KEYS[1]  forq:{q}:limits      hash: field `paused` (see pause.lua)
  ARGV[1]  key prefix "forq:{q}:"

  Returns 1 when this call resumed the queue, 0 when it was not paused (no wake).
  Transitions: none
]]
--@include includes/wake

local resumed = redis.call('HDEL', KEYS[1], 'paused')
if resumed == 1 then wake(ARGV[1], 0) end
return resumed
