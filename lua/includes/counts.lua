--[[
  counts: the per-queue totals and per-minute windows `forq stats` and the dashboard read.
]]

local MINUTE_KEEP_MS = 3660000 -- per-minute counts live an hour: the dashboard's rate chart

-- Bump the per-queue totals and the per-minute window used by `forq stats` by n (1).
local function count(prefix, field, at, n)
  n = n or 1
  redis.call('HINCRBY', prefix .. 'stats', field, n)
  local mkey = prefix .. 'minute:' .. math.floor(at / 60000)
  -- the window's expiry is set by the field's first count in that minute, not by each
  -- count (MINUTE_KEEP_MS from then still outlives the minute)
  if redis.call('HINCRBY', mkey, field, n) == n then
    redis.call('PEXPIRE', mkey, MINUTE_KEEP_MS)
  end
end
