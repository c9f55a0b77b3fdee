--[[
  release: give a lease back without counting an attempt or a crash (graceful drain:
  the supervisor stopped the child itself, the job did nothing wrong).

  KEYS[1]  forq:{q}:active      zset
  KEYS[2]  forq:{q}:pending     zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  fencing token
  ARGV[4]  reason (for the history)

  Returns "ok", or "lost" when the token is stale (nothing changes). A job whose cancel
  was requested is finished as cancelled instead of going back to pending.
  Transitions: active -> pending, active -> cancelled
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  Transitions: [*] -> pending, [*] -> scheduled
  (a job that ends releases the jobs waiting on it, or sends them to dead; the end of
  a batch's last member enqueues the batch's callbacks)
]]
--@include includes/time
--@include includes/job
--@include includes/fencing
--@include includes/history
--@include includes/wake
--@include includes/pending
--@include includes/cancel_active

local prefix, id, token, reason = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local jkey = job_key(prefix, id)
local f = held(jkey, token, 'owner', 'cancel_requested')
if not f then return 'lost' end
local at = now_ms()
if f[4] then
  cancel_active(prefix, id, jkey, at, 'cancel requested; released: ' .. reason)
  return 'ok'
end
back_to_pending(prefix, id, jkey, at)
add_history(prefix, id, 'released', at, {reason = reason, owner = f[3]})
wake(prefix, 0)
return 'ok'
