--[[
  schedule_fired: record what became of a schedule's tick, in the record every
  supervisor (and `forq schedules`) reads: the last tick fired or skipped, and the job
  of the last tick that ran (a tick's or a manual trigger's), which overlap = "skip"
  looks at. Each tick itself is enqueued exactly once by its idempotency key (enqueue);
  this keeps the record from going back in time when supervisors race.

  KEYS[1]  forq:schedules        hash: schedule name -> JSON {"last": tick (Unix s),
                                 "job": id, "skipped": the last skipped tick (Unix s)}
  ARGV[1]  schedule name
  ARGV[2]  "tick" (the tick's job is ARGV[4]), "skip" (the tick was skipped: the last
           job still runs) or "trigger" (a manual run: ARGV[4] is its job, the last
           tick stays)
  ARGV[3]  the tick, Unix seconds as a JSON number ("" for trigger)
  ARGV[4]  the job id ("" for skip)

  Returns 1 when the record changed, 0 when a later tick was recorded already.
  Transitions: none
]]

local key = KEYS[1]
local name, mode, tick, job = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local last, last_job, skipped = nil, nil, nil
local raw = redis.call('HGET', key, name)
if raw then
  local ok, rec = pcall(cjson.decode, raw)
  if ok and type(rec) == 'number' then
    last = rec -- written by an older forq: the last tick alone
  elseif ok and type(rec) == 'table' then
    if type(rec['last']) == 'number' then last = rec['last'] end
    if type(rec['job']) == 'string' then last_job = rec['job'] end
    if type(rec['skipped']) == 'number' then skipped = rec['skipped'] end
  end
end
if mode == 'trigger' then
  last_job = job
else
  local t = tonumber(tick)
  if last and t <= last then return 0 end
  last = t
  if mode == 'tick' then last_job = job else skipped = t end
end
local function num(x) if x == nil then return 'null' end return string.format('%.17g', x) end
local out = '{"last":' .. num(last) .. ',"job":' .. (last_job and cjson.encode(last_job) or 'null')
if skipped then out = out .. ',"skipped":' .. num(skipped) end
redis.call('HSET', key, name, out .. '}')
return 1
