--[[
  ack: handlers returned; store each result and mark its job succeeded, and enqueue its
  same-queue follow-up jobs in the same atomic step (so a vote's follow-up job is never
  lost between "written" and "recalculate"). One call acks any number of jobs of one
  queue: a supervisor sends the acks of one loop turn together, and the call's fixed
  costs (the script call, the time, the counters) are paid once for all of them.

  KEYS[1]  forq:{q}:active      zset
  KEYS[2]  forq:{q}:pending     zset
  KEYS[3]  forq:{q}:scheduled   zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  queue name
  ARGV[3..] one group per job:
           job id, fencing token, result (JSON text), n = how many follow-ups follow,
           then n follow-up job specs (JSON, as for enqueue) for this queue

  Returns, per job in order, "ok", or "lost" when the token is stale (nothing changes
  for that job; drop its result). A call for one job returns its answer alone.
]]
--@include _lib

local prefix, queue = ARGV[1], ARGV[2]
local at = nil
local answers = {}
local done = {} -- ids that succeeded, to leave `active` in one ZREM
local woke = false
local i = 3
while i <= #ARGV do
  local id, token, result = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local n = tonumber(ARGV[i + 3])
  local jkey = job_key(prefix, id)
  local f = held(jkey, token, unpack(SUCCEED_FIELDS))
  if not f then
    answers[#answers + 1] = 'lost'
  else
    at = at or now_ms()
    succeed(prefix, id, jkey, result, at, nil, f, 3, true)
    done[#done + 1] = id
    if n > 0 then
      local specs = {}
      for k = 1, n do specs[k] = cjson.decode(ARGV[i + 3 + k]) end
      if enqueue_followups(prefix, queue, id, specs, at) > 0 then woke = true end
      -- they are enqueued now: the copy an idempotent job's completion record keeps for a
      -- lost ack (see succeed_recorded) is no longer needed
      redis.call('DEL', prefix .. 'done-followups:' .. id)
    end
    answers[#answers + 1] = 'ok'
  end
  i = i + 4 + n
end
if #done > 0 then
  redis.call('ZREM', KEYS[1], unpack(done))
  count(prefix, 'succeeded', at, #done)
  if not woke then slot_freed(prefix) end
end
if #answers == 1 then return answers[1] end
return answers
