-- Prepended to tag.lua and tags.lua: records `clock` at a tag's record key (a deleteByTag's,
-- `<ns>:tag:{<tag>}`, or an expireByTag's, `<ns>:stale:{<tag>}`), only ever forward. The record
-- expires: no entry carrying a tag lives longer than tagTtl after its birth, so once `px` (tagTtl
-- and a margin, see tags.rs) has passed since the record, every entry it judges is gone. Its
-- expiry only ever moves later (the newest record's counts); a record with none (written before
-- records expired) gets one.
local function record_tag(key, clock, px)
  local current = redis.pcall('GET', key)
  px = tonumber(px)
  if type(current) ~= 'string' or (tonumber(current) or 0) < tonumber(clock) then
    local left = redis.call('PTTL', key)
    if left > px then px = left end
    redis.call('SET', key, clock, 'PX', px)
  elseif redis.call('PTTL', key) < px then
    redis.call('PEXPIRE', key, px)
  end
end

