--[[
  cost: what a finished run of a job cost, kept in its record and added to its queue's
  per-group usage totals (`forq usage`).

  The record's `cost` field: "cpu_user_ms,cpu_system_ms,peak_bytes,wall_ms,latency_ms"
  (latency: claim to the handler's first line; empty when unknown), as the supervisor
  measured it (rusage from the kernel, its own memory samples and clock).
    forq:{q}:usage:<hour>  hash  per group G ("" for jobs without one): runs:G =
                                 "jobs,cpu_ms,peak,wall_ms" (peak: the sum of the
                                 runs' peaks, bytes; each exact to 2^53); <hour> = Redis
                                 ms / 3600000; it expires USAGE_KEEP_S after its hour
                                 ends (bounded by time). A forq before 2026-12-03 wrote
                                 a field per figure (jobs:G, cpu_ms:G, peak:G,
                                 wall_ms:G): readers add both.
  Every run counts (a failed attempt cost as much as a successful one). `record_cost`
  keeps a run's cost and adds it to `totals` (a Lua table); `add_usage` writes them: a
  script that ends several jobs (ack) writes each group's sums once. Cost: the record's
  field (in ack, within the HSET that ends the job), one HMGET and one HSET of the
  totals a call, an EXPIREAT with each hour's first run of a group.
]]

local USAGE_KEEP_S = 8 * 24 * 3600 -- a week and a day: `forq usage --since 7d` works

-- Keep `cost` in the record at `jkey` and add it to `totals[group]`; false if there is
-- none (or it is not the supervisor's format: nothing kept), else the cost. `deferred`:
-- the caller writes the field itself, in its own HSET of the record (ack, which ends the
-- job with one): nothing is written here.
local function record_cost(jkey, cost, group, totals, deferred)
  if not cost or cost == '' then return false end
  local u, s, p, w = string.match(cost, '^(%d+),(%d+),(%d+),(%d+),%d*$')
  if not u then return false end
  if not deferred then redis.call('HSET', jkey, 'cost', cost) end
  local g = group or ''
  local t = totals[g]
  if not t then
    t = {0, 0, 0, 0}
    totals[g] = t
  end
  t[1], t[2], t[3], t[4] = t[1] + 1, t[2] + tonumber(u) + tonumber(s), t[3] + tonumber(p),
    t[4] + tonumber(w)
  return cost
end

-- Add the `totals` `record_cost` gathered to the queue's hourly usage: each group's four
-- figures packed in one field (read, added to, written back: one HMGET and one HSET a
-- call, whatever the number of groups, where a counter per figure took four HINCRBY a
-- group).
local function add_usage(prefix, totals, at)
  local hour = math.floor(at / 3600000)
  local ukey = prefix .. 'usage:' .. hour
  local names, sums = {}, {}
  for g, t in pairs(totals) do
    names[#names + 1] = 'runs:' .. g
    sums[#sums + 1] = t
  end
  local old = redis.call('HMGET', ukey, unpack(names))
  local set, fresh = {}, false
  for k, name in ipairs(names) do
    local t, was = sums[k], {0, 0, 0, 0}
    if old[k] then
      local a, b, c, d = string.match(old[k], '^(%d+),(%d+),(%d+),(%d+)$')
      if a then was = {tonumber(a), tonumber(b), tonumber(c), tonumber(d)} end
    else
      fresh = true -- the group's first run this hour
    end
    set[#set + 1] = name
    set[#set + 1] = string.format('%.0f,%.0f,%.0f,%.0f', was[1] + t[1], was[2] + t[2],
      was[3] + t[3], was[4] + t[4])
  end
  redis.call('HSET', ukey, unpack(set))
  if fresh then redis.call('EXPIREAT', ukey, (hour + 1) * 3600 + USAGE_KEEP_S) end
end
