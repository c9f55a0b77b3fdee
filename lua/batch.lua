#!lua
--[[
  batch: open a batch (fan-out / fan-in) and enqueue its members that live in this
  queue, in one step. Its callbacks are enqueued, exactly once, by the transition that
  ends its last member (ack, fail, reclaim, cancel: see links_ended in includes/finish). Opened by
  a producer (`Queue.batch`), or by a running job from its handler, fenced by that
  job's lease token: the job then counts as a member until it ends, so a batch inside
  a batch's member ends that member only once the inner batch is done. Members on other
  queues are enqueued by their queue's enqueue call, with the same batch fields.
  A flagged script (Redis 7): refused before it runs when Redis is out of memory.

  KEYS[1]  forq:{q}:pending     zset
  KEYS[2]  forq:{q}:scheduled   zset
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  queue name
  ARGV[3]  batch id
  ARGV[4]  batch JSON {total: members in all queues, on_success, on_complete (job specs,
           enqueued in this queue), members: [[queue, job id], ...]}
  ARGV[5]  the opening job's id, or "" for a producer
  ARGV[6]  the opening job's fencing token, or ""
  ARGV[7..] this queue's member specs (JSON, as for enqueue, with batch and batch_queue)

  An error reply "forq: depends_on of job X: no job Y in queue Q" when a member depends
  on an unknown job: then nothing was written.
  Transitions: [*] -> pending, [*] -> scheduled, [*] -> waiting
  Transitions: waiting -> pending, waiting -> scheduled, waiting -> dead
  (its members, as enqueue's; a batch whose members all ended already enqueues its callbacks)
  Returns {status, enqueued}: status "opened", "exists" (a batch with this id was
  opened before: nothing changes) or "lost" (the opener's token is stale: nothing
  changes); enqueued, how many member jobs were added.
]]
--@include includes/time
--@include includes/job
--@include includes/fencing
--@include includes/counts
--@include includes/wake
--@include includes/enqueue_job
--@include includes/batches
--@include includes/depends_on

local prefix, queue, bid = ARGV[1], ARGV[2], ARGV[3]
local opener, token = ARGV[5], ARGV[6]
if opener ~= '' then
  if not held(job_key(prefix, opener), token) then return {'lost', 0} end
else
  opener = nil
end
local specs, refused = decode_specs(prefix, queue, 7)
if not specs then return refused end
local at = now_ms()
if not batch_open(prefix, bid, cjson.decode(ARGV[4]), opener, at) then return {'exists', 0} end
local added, earliest = 0, nil
for _, spec in ipairs(specs) do
  spec['parent'] = opener
  local r
  if spec['depends_on'] then r = enqueue_waiting(prefix, queue, spec, at)
  else r = enqueue_one(prefix, queue, spec, at) end
  if r[2] ~= 'duplicate' then
    added = added + 1
    local due = r[2] == 'pending' and 0 or r[3]
    if earliest == nil or due < earliest then earliest = due end
  end
end
if added > 0 then count(prefix, 'enqueued', at, added) end
if earliest ~= nil then wake(prefix, earliest) end
return {'opened', added}
