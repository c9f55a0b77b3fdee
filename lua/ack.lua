--[[
  ack: the handler returned; store its result and mark the job succeeded, and enqueue
  its same-queue follow-up jobs in the same atomic step (so a vote's follow-up job is
  never lost between "written" and "recalculate").

  KEYS[1]  forq:{q}:active      zset
  KEYS[2]  forq:{q}:pending     zset
  KEYS[3]  forq:{q}:scheduled   zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  queue name
  ARGV[3]  job id
  ARGV[4]  fencing token
  ARGV[5]  result (JSON text)
  ARGV[6..] follow-up job specs (JSON, as for enqueue) for this queue

  Returns "ok", or "lost" when the token is stale (nothing changes; drop the result).
]]
--@include _lib

local prefix, queue, id, token, result = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local jkey = job_key(prefix, id)
local f = held(jkey, token, unpack(SUCCEED_FIELDS))
if not f then return 'lost' end
local at = now_ms()
succeed(prefix, id, jkey, result, at, nil, f, 3)
local specs = {}
for i = 6, #ARGV do specs[#specs + 1] = cjson.decode(ARGV[i]) end
local woke = enqueue_followups(prefix, queue, id, specs, at) > 0
if #ARGV >= 6 then
  -- they are enqueued now: the copy an idempotent job's completion record keeps for a
  -- lost ack (see succeed_recorded) is no longer needed
  redis.call('DEL', prefix .. 'done-followups:' .. id)
end
if not woke then slot_freed(prefix) end
return 'ok'
