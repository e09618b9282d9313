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

-- An expireByTag's record at `key` (`<ns>:stale:{<tag>}`): `<clock>` or `<clock> <until>`, where
-- until (epoch ms) ends the window in which what it made stale is served; `untl` is '-' for none.
-- A key keeps one window, the earliest of those not over; one that is over (by `now`) is first
-- folded into the tag's deleteByTag record at `tag_key` (same slot), so what it made stale stays
-- dead. The clock only moves forward; the expiry only later (as record_tag's).
local function record_stale(key, tag_key, clock, untl, now, px)
  local current = redis.pcall('GET', key)
  local c, u = 0, nil
  if type(current) == 'string' then
    local cs, us = string.match(current, '^(%d+) ?(%d*)$')
    c = tonumber(cs) or 0
    u = tonumber(us)
  end
  clock = math.max(tonumber(clock), c)
  local nu = tonumber(untl)
  if c > 0 and u then
    if u <= tonumber(now) then
      record_tag(tag_key, c, px)
    elseif not nu or u < nu then
      nu = u
    end
  end
  local value = string.format('%d', clock)
  if nu then value = value .. ' ' .. string.format('%d', nu) end
  px = tonumber(px)
  local left = redis.call('PTTL', key)
  if left > px then px = left end
  redis.call('SET', key, value, 'PX', px)
end

