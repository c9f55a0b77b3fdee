--[[
  dead_letter: which dead jobs an operator's tool (requeue_dead, purge_dead) acts on.
]]

-- The ids a dead-letter tool acts on: ARGV[3], ARGV[4], … or, with mode "all", the
-- oldest ARGV[3] of the dead set.
local function dead_ids(dead_key, mode)
  if mode == 'all' then
    return redis.call('ZRANGE', dead_key, 0, tonumber(ARGV[3]) - 1)
  end
  local ids = {}
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
  return ids
end
