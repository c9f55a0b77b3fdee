--[[
  find: one page of a walk through one of a queue's sorted sets, in score order, keeping
  the jobs that pass the filters (`Queue.find`, `forq jobs`, the dashboard's filters and
  bulk actions). It reads only. Work per call is bounded: at most ARGV[6] entries
  examined, at most ARGV[14] bytes of arguments searched; the reply's cursor goes on
  where it stopped, so a walk of any size is many short calls, never one long one.

  KEYS[1]  the set walked: forq:{q}:pending, scheduled, active, waiting, dead, finished,
           or gpending:<group> (a group's pending jobs)
  ARGV[1]  key prefix "forq:{q}:"
  ARGV[2]  cursor: the score of the last entry examined ("" to start at the beginning)
  ARGV[3]  cursor: the id of the last entry examined ("" with ARGV[2] "")
  ARGV[4]  walk no further than this score ("+inf" for the whole set): a bulk action
           passes the set's last score when it started, so a job that re-enters the set
           while it runs (requeued, dead again) is not chased
  ARGV[5]  most entries to examine in this call
  ARGV[6]  most matches to return in this call
  ARGV[7]  the state the job's record must have (the set's state; for `finished`, one
           of succeeded, dead, cancelled)
  ARGV[8]  task name it must have, or ""
  ARGV[9]  group it must have, or ""
  ARGV[10] text its args or kwargs JSON must hold (plain text, not a pattern), or ""
  ARGV[11] its time for ARGV[12..13]: "score" (the set's score is a time: dead,
           finished), or a record field (enqueued_at, started_at), or ""
  ARGV[12] not older than this many ms (by Redis's clock), or ""
  ARGV[13] older than this many ms, or ""
  ARGV[14] most bytes of args and kwargs to search in this call (ARGV[10])

  Returns {next_score, next_id, done, examined, gone, match1, match2, ...}
    next_score, next_id  the cursor: the last entry examined ("" when none was)
    done          1 when the walk reached the end of the set (or ARGV[4])
    examined      entries looked at in this call
    gone          entries whose record is missing (trimmed, expired, purged)
    matchN        {id, score, then the fields FIELDS names, in that order}: `error` is
                  the record's JSON when short, else {type, message} cut to 1000 bytes
  An entry that left the set between two calls is no problem: the walk goes on after
  its (score, id), equal scores being ordered by id as Redis orders them.
  Transitions: none
]]
--@include includes/time
--@include includes/job

local key, prefix = KEYS[1], ARGV[1]
local stop_score = ARGV[4]
local budget = tonumber(ARGV[5])
local want = tonumber(ARGV[6])
local state, task, group, needle = ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local time_field = ARGV[11]
local bytes_left = tonumber(ARGV[14])
local at = now_ms()
local newest = nil -- the time filters as bounds on that time (ms)
local oldest = nil
if ARGV[12] ~= '' then oldest = at - tonumber(ARGV[12]) end
if ARGV[13] ~= '' then newest = at - tonumber(ARGV[13]) end
-- where the walk stops: past `stop` (at `stop` too when `stop_open`)
local stop, stop_open = nil, false
if stop_score ~= '+inf' then stop = tonumber(stop_score) end
if time_field == 'score' and newest and (stop == nil or newest <= stop) then
  stop, stop_open = newest, true -- a time-ordered set stops at the newest time wanted
end
local FIELDS = {'task', 'group', 'enqueued_at', 'started_at', 'attempts', 'crashes', 'run_at',
  'finished_at', 'priority', 'key', 'owner', 'dead_reason', 'lifo', 'error', 'state'}
local TASK, GROUP, ENQUEUED_AT, STARTED_AT, ERROR, STATE = 1, 2, 3, 4, 14, 15
local MAX_ERROR = 2000

-- Whether string a sorts after b, byte by byte (as Redis orders equal scores).
local function bytes_after(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end

-- The rank of the first entry after the cursor.
local function start_rank()
  if ARGV[2] == '' then
    if time_field == 'score' and oldest then
      return redis.call('ZCOUNT', key, '-inf', '(' .. oldest)
    end
    return 0
  end
  local score, id = ARGV[2], ARGV[3]
  local s = redis.call('ZSCORE', key, id)
  if s and tonumber(s) == tonumber(score) then return redis.call('ZRANK', key, id) + 1 end
  -- it left the set: the first entry after (score, id), found by rank among the equal
  -- scores (ordered by their bytes, as Redis orders them; Lua's `<` would use the locale)
  local lo = redis.call('ZCOUNT', key, '-inf', '(' .. score)
  local hi = lo + redis.call('ZCOUNT', key, score, score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if bytes_after(redis.call('ZRANGE', key, mid, mid)[1], id) then hi = mid else lo = mid + 1 end
  end
  return lo
end

local function short_error(raw)
  if not raw or #raw <= MAX_ERROR then return raw end
  local ok, err = pcall(cjson.decode, raw)
  if not ok or type(err) ~= 'table' then return nil end
  local out = {}
  for _, name in ipairs({'type', 'message', 'reason'}) do
    if type(err[name]) == 'string' then out[name] = string.sub(err[name], 1, 1000) end
  end
  return cjson.encode(out)
end

local function matches(id, f)
  if f[STATE] ~= state then return false end
  if task ~= '' and f[TASK] ~= task then return false end
  if group ~= '' and f[GROUP] ~= group then return false end
  if time_field ~= '' and time_field ~= 'score' and (oldest or newest) then
    local i = time_field == 'started_at' and STARTED_AT or ENQUEUED_AT
    local t = tonumber(f[i])
    if not t or (oldest and t < oldest) or (newest and t >= newest) then return false end
  end
  if needle ~= '' then
    local jkey = job_key(prefix, id)
    local a = redis.call('HMGET', jkey, 'args', 'kwargs')
    bytes_left = bytes_left - #(a[1] or '') - #(a[2] or '')
    if not (string.find(a[1] or '', needle, 1, true) or string.find(a[2] or '', needle, 1, true)) then
      return false
    end
  end
  return true
end

local rank = start_rank()
local out = {'', '', 0, 0, 0}
local examined, gone, found = 0, 0, 0
local done = 0
local CHUNK = 100
while examined < budget and found < want and bytes_left > 0 do
  local page = redis.call('ZRANGE', key, rank, rank + math.min(CHUNK, budget - examined) - 1,
    'WITHSCORES')
  if #page == 0 then done = 1 break end
  for i = 1, #page, 2 do
    local id, score = page[i], page[i + 1]
    local s = tonumber(score)
    if stop and (s > stop or (stop_open and s == stop)) then done = 1 break end
    examined = examined + 1
    rank = rank + 1
    out[1], out[2] = score, id
    local f = redis.call('HMGET', job_key(prefix, id), unpack(FIELDS))
    if not f[STATE] then
      gone = gone + 1
    elseif matches(id, f) then
      f[ERROR] = short_error(f[ERROR]) or false
      local m = {id, score}
      for j = 1, #FIELDS do m[#m + 1] = f[j] end
      out[#out + 1] = m
      found = found + 1
    end
    if found >= want or bytes_left <= 0 or examined >= budget then break end
  end
  if done == 1 then break end
end
out[3], out[4], out[5] = done, examined, gone
return out
