--[[
  step: record a durable step's result in a running job (`current().step`), fenced by
  the lease token; the handler waits for this answer before it goes on. A later run of
  the job gets every recorded step with its claim (the job hash) and does not run them
  again. Not a state change: the job stays active.

  KEYS[1]  forq:{q}:active      zset (routes the call to the queue's slot)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  fencing token
  ARGV[4]  step name
  ARGV[5]  the step's result, compact JSON (checked and capped by the supervisor)

  Sets in the job hash `step:<name>` = {"n": its number in the job, "at": Redis ms,
  "result": <the result>} and counts it in `step_count`. A step already recorded keeps
  its first result (a handler that got it went on with that one).
  Returns "ok", or "lost" when the token is stale (nothing changes).

  Transitions: none
]]
--@include includes/time
--@include includes/job
--@include includes/fencing

local prefix, id, token, name, result = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local jkey = job_key(prefix, id)
if not held(jkey, token) then return 'lost' end
local field = 'step:' .. name
if redis.call('HEXISTS', jkey, field) == 1 then return 'ok' end
local n = redis.call('HINCRBY', jkey, 'step_count', 1)
redis.call('HSET', jkey, field,
           '{"n":' .. n .. ',"at":' .. now_ms() .. ',"result":' .. result .. '}')
return 'ok'
