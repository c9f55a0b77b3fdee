--[[
  events: the queue's event stream, `prefix .. "events"` (a capped Redis stream): one
  entry per job transition, written by the script that makes it, for followers
  (`Queue.events`, `forq events`, `job.wait`, the dashboard).

  An entry's fields: event (its kind), id (the job's), then those known: task,
  supervisor (the one the job runs or ran on, or claimed it), reason (why it failed,
  died or was cancelled, at most REASON_MAX bytes), and the kind's own: state
  (enqueued, replaced), attempt (failed), crashes (failed by a crash), run_at
  (retried), value and message (progress). Its stream id is its time (Redis ms).
  The switch and the cap are the queue's limits hash field `events`: absent, the
  default EVENTS_KEEP entries; "0", no events (nothing written, nothing read but that
  field); N, about N entries kept (XADD MAXLEN ~ N trims whole stream nodes).
  Cost: the field's HGET once per script call (none when the caller read it with the
  limits: `events_known`), then one XADD per event, plus one HMGET when the caller does
  not know the job's task and owner (the result is remembered for the call).
]]
--@include includes/job

local EVENTS_KEEP = 10000 -- entries kept by default: about 1 MB (~100 bytes an entry)
local EVENTS_KEEP_MAX = 1000000 -- a larger (or infinite) value kept is this many
local REASON_MAX = 200 -- bytes of a reason or a message kept in an entry

local events_keep = nil -- the queue's `events` field, read once per script call
local event_jobs = {} -- id -> {task, owner}, read once per script call

-- At most `max` bytes of `text`, never ending inside a UTF-8 character (a cut one would
-- make the entry unreadable to a client that decodes replies).
local function clip(text, max)
  text = tostring(text)
  if #text <= max then return text end
  local cut = max
  while cut > 0 do
    local b = string.byte(text, cut + 1)
    if b < 128 or b >= 192 then break end -- not a continuation byte: a boundary
    cut = cut - 1
  end
  return string.sub(text, 1, cut)
end

-- The queue's `events` field as read (`raw`: its value, false when absent): a script
-- that reads the limits hash anyway (claim, ack) reads it there and says so here, which
-- saves events_on's own HGET.
local function events_known(raw)
  local n = tonumber(raw) or EVENTS_KEEP
  if n ~= n then n = EVENTS_KEEP end -- NaN: whoever wrote it, the default
  events_keep = math.max(0, math.min(math.floor(n), EVENTS_KEEP_MAX))
end

-- Whether the queue writes events (and how many it keeps), read once per call.
local function events_on(prefix)
  if events_keep == nil then events_known(redis.call('HGET', prefix .. 'limits', 'events')) end
  return events_keep > 0
end

-- The task and lease owner of job `id` ({task, owner}), read once per call; nil when
-- the queue writes no events. A script that writes a job's events after it deleted the
-- lease's fields calls this first: `emit(..., by = true)` then names the owner.
local function event_job(prefix, id)
  if not events_on(prefix) then return nil end
  local known = event_jobs[id]
  if known == nil then
    known = redis.call('HMGET', job_key(prefix, id), 'task', 'owner')
    event_jobs[id] = known
  end
  return known
end

-- Append one event for job `id` of kind `kind`. `task`: the job's task, or nil to read
-- it (false: none); `by`: the supervisor, nil for none, or true for the job's lease
-- owner (read with the task: call this before the lease fields are deleted); `reason`
-- or nil; `extra`: nil or a flat list of further field, value pairs.
local function emit(prefix, kind, id, task, by, reason, extra)
  if not events_on(prefix) then return end
  if task == nil or by == true then
    local known = event_job(prefix, id)
    if task == nil then task = known[1] end
    if by == true then by = known[2] end
  end
  local entry = {'event', kind, 'id', id}
  if task then
    entry[#entry + 1] = 'task'
    entry[#entry + 1] = task
  end
  if by then
    entry[#entry + 1] = 'supervisor'
    entry[#entry + 1] = by
  end
  if reason then
    entry[#entry + 1] = 'reason'
    entry[#entry + 1] = clip(reason, REASON_MAX)
  end
  if extra then
    for k = 1, #extra, 2 do
      entry[#entry + 1] = extra[k]
      entry[#entry + 1] = clip(extra[k + 1], REASON_MAX)
    end
  end
  redis.call('XADD', prefix .. 'events', 'MAXLEN', '~', events_keep, '*', unpack(entry))
end
