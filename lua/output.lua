--[[
  output: keep the tail of a finished child's stdout/stderr in its job record (field
  `output`), sent just before the transition that reports its end (ack, fail, expire,
  release), while the lease is still held: a stale supervisor writes nothing.

  KEYS[1]  forq:{q}:active      zset (routes the call to the queue's slot)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  fencing token
  ARGV[4]  output (the last few KiB, already capped by the supervisor)

  Returns "ok", or "lost" when the token is stale (nothing changes).
  Transitions: none
]]
--@include includes/job
--@include includes/fencing

local prefix, id, token, output = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local jkey = job_key(prefix, id)
if not held(jkey, token) then return 'lost' end
redis.call('HSET', jkey, 'output', output)
return 'ok'
