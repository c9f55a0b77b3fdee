--[[
  output: keep the tail of a finished child's stdout/stderr in its job record (field
  `output`), and the memory samples of its last seconds when it did not succeed (field
  `memory_trail`: its death report's), sent just before the transition that reports its
  end (ack, fail, expire, release), while the lease is still held: a stale supervisor
  writes nothing.

  KEYS[1]  forq:{q}:active      zset (routes the call to the queue's slot)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  fencing token
  ARGV[4]  output (the last few KiB, already capped by the supervisor; "": none)
  ARGV[5]  (optional) memory trail, JSON [[seconds before the end, bytes], ...] ("": none)

  Returns "ok", or "lost" when the token is stale (nothing changes).
  Transitions: none
]]
--@include includes/job
--@include includes/fencing

local prefix, id, token, output, trail = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local jkey = job_key(prefix, id)
if not held(jkey, token) then return 'lost' end
if output ~= '' then redis.call('HSET', jkey, 'output', output) end
if trail and trail ~= '' then
  redis.call('HSET', jkey, 'memory_trail', trail)
else
  redis.call('HDEL', jkey, 'memory_trail')  -- an earlier attempt's, not this one's
end
return 'ok'
