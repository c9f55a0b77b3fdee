--[[
  schedule_define: add, replace, remove, pause or resume a schedule kept in Redis (one
  added at run time: `forq schedule add`, `forq.schedules`). Every supervisor runs these
  beside its config file's, and reloads them when the version field changes.

  KEYS[1]  forq:schedules:runtime  hash: schedule name -> its definition (JSON, the
                                   keys of a TOML schedule entry); "#version" -> a
                                   counter bumped by every change; "#paused:<name>" ->
                                   when it was paused (ms); "#resumed:<name>" -> when it
                                   was last resumed (ms: ticks before it are not caught up)
                                   ("#" starts no schedule name)
  ARGV[1]  "add" (refused when the name is taken), "replace" (add or overwrite),
           "remove", "pause" or "resume"
  ARGV[2]  schedule name
  ARGV[3]  its definition (JSON) for add and replace, else ""

  Returns {outcome, version}: outcome "added", "replaced", "exists" (add refused),
  "removed", "paused", "resumed", "unchanged" (paused or resumed already) or "missing"
  (no such schedule); version is the counter after the call (0 when refused).
  Transitions: none
]]
--@include includes/time

local key = KEYS[1]
local op, name, definition = ARGV[1], ARGV[2], ARGV[3]
local outcome
local exists = redis.call('HEXISTS', key, name) == 1
if op == 'add' or op == 'replace' then
  if exists and op == 'add' then
    return {'exists', 0}
  end
  redis.call('HSET', key, name, definition)
  outcome = exists and 'replaced' or 'added'
elseif not exists then
  return {'missing', 0}
elseif op == 'remove' then
  redis.call('HDEL', key, name, '#paused:' .. name, '#resumed:' .. name)
  outcome = 'removed'
elseif op == 'pause' then
  outcome = redis.call('HSETNX', key, '#paused:' .. name, now_ms()) == 1 and 'paused' or 'unchanged'
elseif op == 'resume' then
  outcome = 'unchanged'
  if redis.call('HDEL', key, '#paused:' .. name) == 1 then
    redis.call('HSET', key, '#resumed:' .. name, now_ms())
    outcome = 'resumed'
  end
else
  return redis.error_reply('forq: schedule_define: unknown operation ' .. op)
end
-- not HINCRBY: a version that is not a number (written by hand) goes on from the clock,
-- so no supervisor can hold the new one already
local version = tonumber(redis.call('HGET', key, '#version'))
if version then version = math.floor(version) else version = now_ms() end
if outcome ~= 'unchanged' then
  version = version + 1
  redis.call('HSET', key, '#version', version)
end
return {outcome, version}
