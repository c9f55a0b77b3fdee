--[[
  history: a job's story, the capped list `job:<id>:history` of JSON entries.
]]
--@include includes/job

local HISTORY_CAP = 100

-- Append one encoded entry to a job's history. RPUSH answers the length: trim only when
-- over the cap (a retried or reclaimed job), not on every entry of the common path.
local function push_history(prefix, id, entry)
  local hkey = job_key(prefix, id) .. ':history'
  if redis.call('RPUSH', hkey, entry) > HISTORY_CAP then
    redis.call('LTRIM', hkey, -HISTORY_CAP, -1)
  end
end

-- Append one entry to a job's history: event name, time (ms), and any extra fields.
local function add_history(prefix, id, event, at, extra)
  local entry = extra or {}
  entry['event'] = event
  entry['at'] = at
  push_history(prefix, id, cjson.encode(entry))
end
