--[[
  policy: the job policy a supervisor's claim stores, and a job's limits read from it.
]]

-- The job policy: the limits (timeout_ms, max_attempts, max_crashes, backoff_*, ...) a
-- supervisor applies where the producer set none. Stored once per distinct policy, as
-- the hash `prefix .. "policy:" .. sha1(policy JSON)` with a field NAME for the default
-- and NAME:TASK for a task's own; a job names its policy in its `policy` field, set by
-- its first claim (so, as a producer's own limits, it never changes under the job).
local function policy_key(prefix, sha)
  return prefix .. 'policy:' .. sha
end

-- A job's limits, named by the keys of `defaults`, as numbers: the job's own field,
-- else its policy's (the task's, then the default), else the value in `defaults`.
-- One HMGET, two when the policy is read.
local function job_limits(prefix, jkey, defaults)
  local names = {}
  for name in pairs(defaults) do names[#names + 1] = name end
  local f = redis.call('HMGET', jkey, 'policy', 'task', unpack(names))
  local out, ask, missing = {}, {}, {}
  for i, name in ipairs(names) do
    out[name] = tonumber(f[i + 2])
    if out[name] == nil and f[1] then
      missing[#missing + 1] = name
      ask[#ask + 1] = name .. ':' .. tostring(f[2])
      ask[#ask + 1] = name
    end
  end
  if #missing > 0 then
    local p = redis.call('HMGET', policy_key(prefix, f[1]), unpack(ask))
    for k, name in ipairs(missing) do out[name] = tonumber(p[2 * k - 1] or p[2 * k]) end
  end
  for name, default in pairs(defaults) do
    if out[name] == nil then out[name] = default end
  end
  return out
end
