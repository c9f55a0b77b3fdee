--[[
  retain: a job that ended succeeded or dead enters its queue's retention index, from
  which the reaper trims it (trim.lua) by age and by count (docs/operations/retention.md).
]]
--@include includes/policy

-- The keep fields of each state, in a job or its policy, and their defaults (forq.defaults;
-- tests/test_retention.py checks these figures against it).
local KEEP_FIELDS = {succeeded = {'keep_succeeded_ms', 'keep_succeeded_count', 'keep_history'},
  dead = {'keep_dead_ms', 'keep_dead_count', 'keep_history'}}
local KEEP_DEFAULTS = {succeeded = {3600000, 10000, 0}, dead = {2592000000, 10000, 0}}
local keep_read = {} -- a script call's policy reads, by state, policy and task
local buckets_listed = {} -- the buckets this call has listed in `kept` already

-- How a job that ended `state` is kept: {age ms, count, history 0/1}. `own` holds the
-- job's own three keep fields (HMGET's answer from index `i`: the producer's, or for a
-- success those its first claim copied from the same policy, lua/claim.lua), a
-- missing one comes from its policy `policy` (the task's, then the default), else the
-- default. A policy is read once per script call for its task (an ack of 32 jobs: one).
local function keep_of(prefix, state, policy, task, own, i)
  local names, out = KEEP_FIELDS[state], {}
  local cached = nil
  for k = 1, 3 do
    out[k] = tonumber(own[i + k - 1])
    if out[k] == nil and policy and not cached then
      local ckey = state .. '|' .. policy .. '|' .. tostring(task)
      cached = keep_read[ckey]
      if cached == nil then
        local ask = {}
        for _, name in ipairs(names) do
          ask[#ask + 1] = name .. ':' .. tostring(task)
          ask[#ask + 1] = name
        end
        local p = redis.call('HMGET', policy_key(prefix, policy), unpack(ask))
        cached = {}
        for n = 1, 3 do cached[n] = tonumber(p[2 * n - 1] or p[2 * n]) or false end
        keep_read[ckey] = cached
      end
    end
    if out[k] == nil and cached then out[k] = cached[k] or nil end
    if out[k] == nil then out[k] = KEEP_DEFAULTS[state][k] end
  end
  return out
end

-- Index the ended job `id` as `state` in the bucket of its keep count: the zset
-- `kept:<state>:<most>` (`most`: its keep count), scored by `until_ms` (when its age
-- runs out), listed in the
-- set `kept`. One ZADD, and one SADD per bucket per script call.
local function retain(prefix, id, state, until_ms, most)
  local bucket = state .. ':' .. string.format('%d', most)
  redis.call('ZADD', prefix .. 'kept:' .. bucket, until_ms, id)
  if not buckets_listed[bucket] then
    redis.call('SADD', prefix .. 'kept', bucket)
    buckets_listed[bucket] = true
  end
end
