--[[
  depends_on: enqueue jobs that wait on others (`waiting` until their parents end).
]]
--@include includes/job
--@include includes/enqueue_job
--@include includes/finish
--@include includes/events
--@include includes/needed

-- The ids in `spec.depends_on` that no job has, given the ids enqueued before it in the
-- same call (`earlier`). Returns the first unknown id, or nil.
local function unknown_parent(prefix, spec, earlier)
  for _, pid in ipairs(spec['depends_on'] or {}) do
    if not earlier[pid] and redis.call('EXISTS', job_key(prefix, pid)) == 0 then
      return pid
    end
  end
  return nil
end

-- The job specs ARGV[first..] (JSON), decoded. A dependency on an unknown job refuses
-- the whole call before anything is written: then nil and the error reply to return.
local function decode_specs(prefix, queue, first)
  local specs, earlier = {}, {}
  for i = first, #ARGV do
    local spec = cjson.decode(ARGV[i])
    local unknown = unknown_parent(prefix, spec, earlier)
    if unknown then
      return nil, redis.error_reply('forq: depends_on of job ' .. tostring(spec['id']) ..
        ': no job ' .. unknown .. ' in queue ' .. queue)
    end
    earlier[spec['id']] = true
    specs[#specs + 1] = spec
  end
  return specs
end

-- Enqueue a job with depends_on (ids of jobs of this queue): `waiting` until they end.
-- A parent that succeeded already counts as done; one that is dead or cancelled sends
-- it to dead at once (or counts as done with allow_failure). Returns as enqueue_one,
-- with the statuses "waiting" and "dead" besides.
local function enqueue_waiting(prefix, queue, spec, at)
  local r, fields = enqueue_one(prefix, queue, spec, at, true)
  if r[2] ~= 'held' then return r end
  local id, run_at = r[1], r[3]
  local jkey = job_key(prefix, id)
  local waiting_on, failed, fstate = 0, nil, nil
  local seen = {}
  for _, pid in ipairs(spec['depends_on']) do
    if not seen[pid] then
      seen[pid] = true
      local pkey = job_key(prefix, pid)
      local st = redis.call('HGET', pkey, 'state')
      if st == 'dead' or st == 'cancelled' then
        if not spec['allow_failure'] and not failed then failed, fstate = pid, st end
        if spec['allow_failure'] then needed_by(pkey, id) end
      elseif st == 'succeeded' then
        needed_by(pkey, id) -- ended: the job reads its record when it runs
      elseif st then
        redis.call('SADD', pkey .. ':dependents', id)
        redis.call('HSET', pkey, 'dependents', 1)
        waiting_on = waiting_on + 1
      end
    end
  end
  local deps = cjson.encode(spec['depends_on'])
  for _, v in ipairs({'state', 'waiting', 'depends_on', deps, 'waiting_on', waiting_on}) do
    fields[#fields + 1] = v
  end
  redis.call('HSET', jkey, unpack(fields))
  redis.call('ZADD', prefix .. 'waiting', at, id)
  if spec['group'] then redis.call('HSET', prefix .. 'limits', 'grouped', 1) end
  local extra = {event = 'enqueued', at = at, depends_on = spec['depends_on']}
  if spec['parent'] then extra['parent'] = spec['parent'] end
  redis.call('RPUSH', jkey .. ':history', cjson.encode(extra))
  emit(prefix, 'enqueued', id, spec['task'], nil, nil, {'state', 'waiting'})
  if failed then
    dependency_failed(prefix, id, jkey, failed, fstate, at)
    return {id, 'dead', run_at}
  end
  if waiting_on == 0 then return {id, release_waiting(prefix, id, jkey, at), run_at} end
  return {id, 'waiting', run_at}
end
