--[[
  reclaim: the reaper. Every expired lease (deadline passed, or expired by a parent)
  goes back to pending with one more crash counted; past max_crashes it goes to dead
  with the last crash reason. Run by every supervisor; concurrent runs are safe because
  each job is moved by whichever call sees it first, atomically.

  KEYS[1]  forq:{q}:active      zset (lease deadline ms)
  KEYS[2]  forq:{q}:pending     zset
  KEYS[3]  forq:{q}:dead        zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  max_crashes to use when the job's record has none
  ARGV[3]  the most leases to reclaim in this call
  ARGV[4]  reclaimer (supervisor id), for the history

  Returns {reclaimed_to_pending, dead, completed, id1, id2, ...}: the counts, then the
    ids moved. `completed` counts idempotent jobs whose completion was already recorded:
    they are marked succeeded instead of run again. A job whose cancel was requested
    is finished as cancelled (listed in the ids, in none of the counts).
  Cost: O(log n + expired), never a scan of all active jobs.
  Transitions: active -> pending, active -> dead, active -> succeeded
  Transitions: active -> cancelled, [*] -> pending, [*] -> scheduled
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  (a job that ends releases the jobs waiting on it, or sends them to dead; the end of
  a batch's last member enqueues the batch's callbacks)
]]
--@include includes/time
--@include includes/job
--@include includes/history
--@include includes/counts
--@include includes/wake
--@include includes/policy
--@include includes/groups
--@include includes/pending
--@include includes/finish
--@include includes/succeed
--@include includes/cancel_active

local active_key, pending_key, dead_key = KEYS[1], KEYS[2], KEYS[3]
local prefix = ARGV[1]
local default_max = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local reclaimer = ARGV[4]
local at = now_ms()
local expired = redis.call('ZRANGEBYSCORE', active_key, '-inf', at, 'LIMIT', 0, limit)
local to_pending, to_dead, completed = 0, 0, 0
local ids = {}
for _, id in ipairs(expired) do
  local jkey = job_key(prefix, id)
  if redis.call('EXISTS', jkey) == 0 then
    redis.call('ZREM', active_key, id)
  else
    ids[#ids + 1] = id
    local done = redis.call('GET', prefix .. 'done:' .. id)
    if done then
      succeed_recorded(prefix, id, jkey, done, at)
      completed = completed + 1
    elseif redis.call('HEXISTS', jkey, 'cancel_requested') == 1 then
      cancel_active(prefix, id, jkey, at, 'cancel requested; lease expired')
    else
      local f = redis.call('HMGET', jkey, 'owner', 'token', 'last_crash', 'group')
      local reason = f[3] or ('lease expired (owner ' .. tostring(f[1]) .. ')')
      local crashes = redis.call('HINCRBY', jkey, 'crashes', 1)
      local max_crashes = job_limits(prefix, jkey, {max_crashes = default_max}).max_crashes
      redis.call('HDEL', jkey, 'last_crash')
      count(prefix, 'crashed', at)
      if crashes >= max_crashes then
        local why = reason .. ' (crashes exhausted: ' .. crashes .. ')'
        redis.call('ZREM', active_key, id)
        if f[4] then group_release(prefix, f[4], at) end
        redis.call('HSET', jkey, 'state', 'dead', 'dead_reason', why, 'finished_at', at)
        redis.call('HDEL', jkey, 'owner', 'token', 'lease_deadline', 'cancel_requested')
        redis.call('ZADD', dead_key, at, id)
        add_history(prefix, id, 'dead', at, {reason = why, by = reclaimer})
        count(prefix, 'dead', at)
        finish(prefix, id, -1, at)
        to_dead = to_dead + 1
      else
        back_to_pending(prefix, id, jkey, at)
        add_history(prefix, id, 'reclaimed', at,
          {reason = reason, by = reclaimer, crashes = crashes, owner = f[1]})
        to_pending = to_pending + 1
      end
    end
  end
end
if to_pending > 0 then wake(prefix, 0) elseif #ids > 0 then slot_freed(prefix) end
local out = {to_pending, to_dead, completed}
for _, id in ipairs(ids) do out[#out + 1] = id end
return out
