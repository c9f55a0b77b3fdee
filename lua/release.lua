--[[
  release: give a lease back without counting an attempt or a crash (graceful drain:
  the supervisor stopped the child itself, the job did nothing wrong).

  KEYS[1]  forq:{q}:active      zset
  KEYS[2]  forq:{q}:pending     zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  fencing token
  ARGV[4]  reason (for the history)

  Returns "ok", or "lost" when the token is stale (nothing changes).
]]
--@include _lib

local prefix, id, token, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local jkey = job_key(prefix, id)
local f = redis.call('HMGET', jkey, 'state', 'token', 'owner')
if f[1] ~= 'active' or f[2] ~= token then
  return 'lost'
end
local at = now_ms()
back_to_pending(prefix, id, jkey)
add_history(prefix, id, 'released', at, {reason = reason, owner = f[3]})
wake(prefix, 0)
return 'ok'
