--[[
  job: a job's record, the hash `prefix .. "job:" .. id` (`prefix` is "forq:{queue}:";
  its history is the list at that key .. ":history").
]]

local function job_key(prefix, id)
  return prefix .. 'job:' .. id
end

-- Integer field of a job hash, or `default` when unset.
local function num_field(jkey, field, default)
  local v = redis.call('HGET', jkey, field)
  if v then return tonumber(v) end
  return default
end

-- How long a finished job's record is kept when neither the job nor its policy says.
local DEFAULT_RESULT_TTL_MS = 86400000
