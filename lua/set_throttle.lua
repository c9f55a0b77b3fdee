--[[
  set_throttle: an operator throttles a queue, or one of its groups, or lifts a throttle
  (`Queue.throttle`, `Queue.unthrottle`, `forq throttle`): as a handler's throttle
  (throttle.lua), without a job. Not a state change.

  KEYS[1]  forq:{q}:limits      hash: field `throttled_until` (includes/throttle)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  how long, ms; 0 lifts the throttle in force
  ARGV[3]  a group, or "" for the whole queue

  Setting: a throttle in force that ends later stays. Returns the end in force (Redis
  ms); lifting: 1 when a throttle was in force, else 0.
  Transitions: none
]]
--@include includes/time
--@include includes/throttle

local prefix, delay = ARGV[1], math.floor(tonumber(ARGV[2]) or 0)
local group = nil
if ARGV[3] ~= '' then group = ARGV[3] end
local at = now_ms()
if delay <= 0 then
  if unthrottle(prefix, group, at) then return 1 end
  return 0
end
return throttle(prefix, group, at + delay, at)
