--[[
  on_dead: what a job's death sets off besides its end (finish): its "dead" event, and
  the queue's on_dead job.
]]
--@include includes/job
--@include includes/counts
--@include includes/wake
--@include includes/enqueue_job
--@include includes/events

local ON_DEAD_REASON_MAX = 1000 -- bytes of the reason passed to the on_dead job

-- Job `id` died (`why`; `by`: the supervisor, or nil) at `at`: its "dead" event, and,
-- when the queue names an on_dead task (the limits hash's `on_dead`, `[[queue]]
-- on_dead`), a job of that task enqueued in this same queue, in this same script, with
-- kwargs {job_id, task, reason}. A job that is itself an on_dead job (its
-- `on_dead_of`) sets off none when it dies: no loop. The new job's id is the dead
-- one's with "-on-dead-N" (its Nth death: a requeued job that dies again is reported
-- again); its `parent` is the dead job. Call it before `finish`, which may delete the
-- dead job's record.
local function job_died(prefix, id, why, at, by)
  local jkey = job_key(prefix, id)
  local f = redis.call('HMGET', jkey, 'task', 'queue', 'on_dead_of')
  emit(prefix, 'dead', id, f[1] or false, by, why)
  if f[3] then return end
  local task = redis.call('HGET', prefix .. 'limits', 'on_dead')
  if not task then return end
  local n = redis.call('HINCRBY', jkey, 'on_dead_sent', 1)
  local kwargs = {job_id = id, task = f[1] or '', reason = clip(why, ON_DEAD_REASON_MAX)}
  local spec = {id = id .. '-on-dead-' .. n, task = task, args = '[]',
    kwargs = cjson.encode(kwargs), parent = id}
  local r = enqueue_one(prefix, f[2] or string.match(prefix, '{(.*)}'), spec, at)
  if r[2] ~= 'duplicate' then
    redis.call('HSET', job_key(prefix, r[1]), 'on_dead_of', id)
    count(prefix, 'enqueued', at)
    wake(prefix, 0)
  end
end
