--[[
  cost: what a finished run of a job cost, kept in its record and added to its queue's
  per-group usage totals (`forq usage`).

  The record's `cost` field: "cpu_user_ms,cpu_system_ms,peak_bytes,wall_ms,latency_ms"
  (latency: claim to the handler's first line; empty when unknown), as the supervisor
  measured it (rusage from the kernel, its own memory samples and clock).
    forq:{q}:usage:<hour>  hash  per group G ("" for jobs without one): jobs:G,
                                 cpu_ms:G, peak:G (sum of the runs' peaks, bytes),
                                 wall_ms:G; <hour> = Redis ms / 3600000; it expires
                                 USAGE_KEEP_S after its hour ends (bounded by time)
  Every run counts (a failed attempt cost as much as a successful one). Cost: one HSET
  and four HINCRBY per run, an EXPIREAT with each hour's first run of a group.
]]

local USAGE_KEEP_S = 8 * 24 * 3600 -- a week and a day: `forq usage --since 7d` works

local function record_cost(prefix, jkey, cost, group, at)
  if not cost or cost == '' then return end
  local u, s, p, w = string.match(cost, '^(%d+),(%d+),(%d+),(%d+),%d*$')
  if not u then return end -- not the supervisor's format: nothing kept
  redis.call('HSET', jkey, 'cost', cost)
  local hour = math.floor(at / 3600000)
  local ukey = prefix .. 'usage:' .. hour
  local g = group or ''
  if redis.call('HINCRBY', ukey, 'jobs:' .. g, 1) == 1 then
    redis.call('EXPIREAT', ukey, (hour + 1) * 3600 + USAGE_KEEP_S)
  end
  redis.call('HINCRBY', ukey, 'cpu_ms:' .. g, tonumber(u) + tonumber(s))
  redis.call('HINCRBY', ukey, 'peak:' .. g, p)
  redis.call('HINCRBY', ukey, 'wall_ms:' .. g, w)
end
