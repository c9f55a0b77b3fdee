--[[
  parents: one page of a running job's parents and their results, for its handler
  (`current().parent_results()`), fenced by the lease token: a run that no longer
  holds the job reads nothing. Its parents are the jobs of its `depends_on` (all in
  this queue), or, for a batch's callback (`callback_of`, set when the batch enqueued
  it), the batch's members (on any queue). Not a state change.

  KEYS[1]  forq:{q}:active      zset (routes the call to the queue's slot)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  job id
  ARGV[3]  fencing token
  ARGV[4]  the index of the page's first parent (0 for the first page)
  ARGV[5]  the most parents in a page
  ARGV[6]  the most bytes of results and reasons in a page (a page holds at least one
           parent, whatever its size)

  Returns {"lost"} when the token is stale; {"expired"} for a callback whose batch's
  record is gone (its result_ttl passed); else {total, next, p1, p2, ...}: total
  parents, the index of the next page's first one (-1 after the last page) and, per
  parent, {queue, id, state, result, reason}: state "" when its record is gone
  (expired or purged), result "" unless it succeeded (its JSON as stored), reason its
  dead reason or its last error's, else "". A parent on another queue (a batch
  member) is {queue, id} alone: its record is in another slot, the caller reads it.
  Transitions: none
]]
--@include includes/job
--@include includes/fencing

local prefix, id, token = ARGV[1], ARGV[2], ARGV[3]
local first, most, budget = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local jkey = job_key(prefix, id)
local f = held(jkey, token, 'queue', 'depends_on', 'callback_of')
if not f then return {'lost'} end
local queue = f[3]
local refs, total = {}, 0
if f[4] then
  local ids = cjson.decode(f[4])
  total = #ids
  for i = first + 1, math.min(total, first + most) do refs[#refs + 1] = {queue, ids[i]} end
elseif f[5] then
  local members = prefix .. 'batch:' .. f[5] .. ':members'
  total = redis.call('LLEN', members)
  if total == 0 then return {'expired'} end
  for _, entry in ipairs(redis.call('LRANGE', members, first, first + most - 1)) do
    refs[#refs + 1] = cjson.decode(entry)
  end
end

local function reason_of(dead_reason, err)
  if dead_reason then return dead_reason end
  if not err then return '' end
  local ok, decoded = pcall(cjson.decode, err)
  if ok and type(decoded) == 'table' and type(decoded['reason']) == 'string' then
    return decoded['reason']
  end
  return ''
end

local out, used = {total, -1}, 0
for i, ref in ipairs(refs) do
  if ref[1] ~= queue then
    out[#out + 1] = {ref[1], ref[2]}
  else
    local p = redis.call('HMGET', job_key(prefix, ref[2]), 'state', 'result', 'dead_reason',
      'error')
    local state = p[1] or ''
    local result = ''
    if state == 'succeeded' then result = p[2] or 'null' end
    local reason = reason_of(p[3], p[4])
    if i > 1 and used + #result + #reason > budget then
      out[2] = first + i - 1
      return out
    end
    used = used + #result + #reason
    out[#out + 1] = {ref[1], ref[2], state, result, reason}
  end
end
if first + #refs < total then out[2] = first + #refs end
return out
