--[[
  needed: the jobs that will read an ended job's record (its result or reason) through
  depends_on, so retention (trim.lua) keeps the record while any of them has not ended.
]]

-- Job `kid` (waiting, of the same queue) counts the end of the job at `pkey` and will
-- read its record when it runs: `pkey .. ":needed_by"` lists it. The set lives as long
-- as the record (finish gives it the record's expiry; trim deletes it with the record).
local function needed_by(pkey, kid)
  local nkey = pkey .. ':needed_by'
  redis.call('SADD', nkey, kid)
  local ttl = redis.call('PTTL', pkey)
  if ttl > 0 then redis.call('PEXPIRE', nkey, ttl) end
end
