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
           job id, fencing token, result (JSON text), the run's cost ("" none: see
           includes/cost), n = how many follow-ups follow, then n follow-up job specs
           (JSON, as for enqueue) for this queue

  Returns, per job in order, "ok", or "lost" when the token is stale (nothing changes
  for that job; drop its result). A call for one job returns its answer alone.
  Transitions: active -> succeeded, [*] -> pending, [*] -> scheduled
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  (a job that ends releases the jobs waiting on it, or sends them to dead; the end of
  a batch's last member enqueues the batch's callbacks)
  Events: succeeded, dead, enqueued
]]
--@include includes/time
--@include includes/job
--@include includes/fencing
--@include includes/counts
--@include includes/wake
--@include includes/enqueue_job
--@include includes/succeed
--@include includes/cost
--@include includes/breaker
--@include includes/events

-- succeed's fields and the task, whose successes count in its circuit breaker
local ACK_FIELDS = {unpack(SUCCEED_FIELDS)}
ACK_FIELDS[#ACK_FIELDS + 1] = 'task'
local TASK_AT = 2 + #ACK_FIELDS

local prefix, queue = ARGV[1], ARGV[2]
local answers = {}
local held_jobs = {} -- {id, jkey, result, fields, first follow-up's ARGV index, count, cost}
local i = 3
while i <= #ARGV do
  local id, token = ARGV[i], ARGV[i + 1]
  local n = tonumber(ARGV[i + 4])
  local jkey = job_key(prefix, id)
  local f = held(jkey, token, unpack(ACK_FIELDS))
  if f then
    held_jobs[#held_jobs + 1] = {id, jkey, ARGV[i + 2], f, i + 5, n, ARGV[i + 3]}
    answers[#answers + 1] = 'ok'
  else
    answers[#answers + 1] = 'lost'
  end
  i = i + 5 + n
end
if #held_jobs > 0 then
  -- the batch leaves `active` first, in one ZREM: a write that a full Redis (maxmemory,
  -- noeviction) still allows, and a script that has written may go on, so acks land in
  -- a full Redis as each single ack did (chaos's redis_full fault)
  local ids = {}
  for k, job in ipairs(held_jobs) do ids[k] = job[1] end
  redis.call('ZREM', KEYS[1], unpack(ids))
  -- the queue's events switch and max_in_flight, read together (includes/events, wake)
  local limits = redis.call('HMGET', prefix .. 'limits', 'events', 'max_in_flight')
  events_known(limits[1])
  local at = now_ms()
  local woke = false
  local totals, metered = {}, false -- the runs' costs, summed per group for one write
  local tasks = {} -- task -> successes in this call: one count per task
  for _, job in ipairs(held_jobs) do
    local id, jkey, result, f, first, n, cost = unpack(job)
    local task = f[TASK_AT]
    if task then tasks[task] = (tasks[task] or 0) + 1 end
    -- written by `succeed`, in the HSET that ends the job
    local kept = record_cost(jkey, cost, f[6], totals, true)
    if kept then metered = true end
    succeed(prefix, id, jkey, result, at, nil, f, 3, true, kept and {'cost', kept} or nil)
    if n > 0 then
      local specs = {}
      for k = 1, n do specs[k] = cjson.decode(ARGV[first + k - 1]) end
      if enqueue_followups(prefix, queue, id, specs, at) > 0 then woke = true end
      -- they are enqueued now: the copy an idempotent job's completion record keeps for a
      -- lost ack (see succeed_recorded) is no longer needed
      redis.call('DEL', prefix .. 'done-followups:' .. id)
    end
  end
  if metered then add_usage(prefix, totals, at) end
  count(prefix, 'succeeded', at, #held_jobs)
  for task, n in pairs(tasks) do breaker_count(prefix, task, at, n) end
  if not woke then slot_freed(prefix, limits[2]) end
end
if #answers == 1 then return answers[1] end
return answers
