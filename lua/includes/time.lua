--[[
  time: the clock of every script: Redis TIME in ms, never a client's clock.
]]

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
