--[[
  progress: record the latest progress of running jobs of one supervisor in this queue,
  in one call (sent with its lease extension). Not a state change: no history entry, and
  a stale holder writes nothing.

  KEYS[1]  forq:{q}:active      zset (routes the call to the queue's slot)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2..] groups of four: job id, fencing token, value (0..1), message

  Sets, in each job held under its token: progress (the value), progress_message,
  progress_at (Redis ms).
  Returns a list with "ok", or "lost" for a stale token, per job.

  Transitions: none
]]
--@include includes/time
--@include includes/job
--@include includes/fencing

local prefix = ARGV[1]
local at = now_ms()
local answers = {}
for i = 2, #ARGV, 4 do
  local id, token = ARGV[i], ARGV[i + 1]
  local jkey = job_key(prefix, id)
  if held(jkey, token) then
    redis.call('HSET', jkey, 'progress', ARGV[i + 2], 'progress_message', ARGV[i + 3],
               'progress_at', at)
    answers[#answers + 1] = 'ok'
  else
    answers[#answers + 1] = 'lost'
  end
end
return answers
