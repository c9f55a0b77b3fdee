--[[
  batch_relay: deliver the ends of batch members that live on other queues to their
  batch, in the batch's slot. Such a member's end is written to its own queue's relay
  (forq:{member queue}:relay) by the transition that ended it; the reaper reads it,
  calls this, then removes what was delivered. Delivering twice counts once (the
  batch's set of ended members), so a reaper that dies in between loses nothing.

  KEYS[1]  forq:{q}:pending     zset (names the batch's slot; not written here unless a
           callback is enqueued)
  ARGV[1]  key prefix "forq:{q}:" of the batches' queue
  ARGV[2..] one triple per member end: batch id, member job id, "1" (succeeded) or "0"

  Transitions: [*] -> pending, [*] -> scheduled
  (the callbacks of a batch whose last member's end this delivers)
  Returns how many of the ends were counted (the others had been before).
]]
--@include includes/time
--@include includes/batches

local prefix = ARGV[1]
local at = now_ms()
local counted = 0
for i = 2, #ARGV - 2, 3 do
  if batch_count(prefix, ARGV[i], ARGV[i + 1], ARGV[i + 2] == '1', at) then
    counted = counted + 1
  end
end
return counted
