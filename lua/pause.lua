--[[
  pause: stop every supervisor claiming from this queue, at once: claim refuses a paused
  queue (it reads the same limits hash it reads anyway). Running jobs go on and keep
  their leases; enqueues are accepted and wait in pending or scheduled.

  KEYS[1]  forq:{q}:limits      hash: field `paused` = Redis ms when it was paused
  ARGV[1]  key prefix "forq:{q}:"

  Returns 1 when this call paused the queue, 0 when it was paused already (unchanged).
  Transitions: none
]]
--@include includes/time

return redis.call('HSETNX', KEYS[1], 'paused', now_ms())
