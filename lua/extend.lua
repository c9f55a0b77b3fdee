#!lua flags=allow-oom
--[[
  extend: renew every lease one supervisor holds in this queue, in one call.
  Runs when Redis is out of memory (maxmemory, noeviction): a full Redis must not cost
  running jobs their leases; it grows nothing (a ZADD XX and an HSET of existing fields).

  KEYS[1]  forq:{q}:active      zset (lease deadline ms)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  lease ttl (ms)
  ARGV[3..] pairs: job id, fencing token

  Returns {lost, cancelled, now_ms}
    lost       ids whose lease is no longer held by that token (reclaimed, finished,
               released or missing): the caller must kill the child and drop its result
    cancelled  ids still held whose cancel was requested (`forq cancel`)
  A lease that was reclaimed can never be extended: reclaim changes the state and the
  token in the same atomic step, so extension and reclaim never both win.
  Transitions: none
]]
--@include includes/time
--@include includes/job
--@include includes/fencing

local active_key = KEYS[1]
local prefix = ARGV[1]
local ttl = tonumber(ARGV[2])
local at = now_ms()
local lost, cancelled = {}, {}
for i = 3, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local jkey = job_key(prefix, id)
  local f = held(jkey, token, 'cancel_requested')
  local score = f and redis.call('ZSCORE', active_key, id)
  -- a lease its own parent expired (score 0: the child crashed) is never revived
  if not f or score == false or tonumber(score) == 0 then
    lost[#lost + 1] = id
  else
    local deadline = at + ttl
    redis.call('ZADD', active_key, 'XX', deadline, id)
    redis.call('HSET', jkey, 'lease_deadline', deadline)
    if f[3] then cancelled[#cancelled + 1] = id end
  end
end
return {lost, cancelled, at}
