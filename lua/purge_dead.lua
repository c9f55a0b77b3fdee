--[[
  purge_dead: delete dead jobs and their history for good.

  KEYS[1]  forq:{q}:dead        zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  "ids" to purge ARGV[3..], or "all" to purge up to ARGV[3] of the oldest

  Returns {purged_count, missing_id1, ...}: ids given that were not dead are listed.
  Transitions: dead -> [*]
]]
--@include includes/job
--@include includes/dead_letter

local dead_key = KEYS[1]
local prefix, mode = ARGV[1], ARGV[2]
local ids = dead_ids(dead_key, mode)
local n, missing = 0, {}
for _, id in ipairs(ids) do
  if redis.call('ZREM', dead_key, id) == 1 then
    local jkey = job_key(prefix, id)
    redis.call('DEL', jkey, jkey .. ':history', prefix .. 'done:' .. id,
      prefix .. 'done-followups:' .. id)
    n = n + 1
  else
    missing[#missing + 1] = id
  end
end
local out = {n}
for _, id in ipairs(missing) do out[#out + 1] = id end
return out
