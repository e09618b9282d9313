-- deleteByTag of one tag: records at the tag's key the namespace clock the deletion was given
-- (only ever forward), so an entry carrying the tag and born before that clock reads as dead in
-- every process, then announces it so in-process copies die too. No entry is touched: the cost
-- is one key whatever the number of entries carrying the tag.
-- The record expires: no entry carrying a tag lives longer than tagTtl after its birth, so once
-- ARGV[4] (tagTtl and a margin) has passed since the deletion, every entry it killed is gone and
-- the record means nothing. Its expiry only ever moves later (the newest deletion's counts); a
-- record with none (written before records expired) gets one.
-- KEYS[1] tag key (its own cluster slot). ARGV[1] the clock (from HINCRBY <ns>:meta clock),
-- ARGV[2] channel, ARGV[3] message, ARGV[4] the record's px.
-- Returns 1.
local current = redis.pcall('GET', KEYS[1])
local px = tonumber(ARGV[4])
if type(current) ~= 'string' or (tonumber(current) or 0) < tonumber(ARGV[1]) then
  local left = redis.call('PTTL', KEYS[1])
  if left > px then px = left end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', px)
elseif redis.call('PTTL', KEYS[1]) < px then
  redis.call('PEXPIRE', KEYS[1], px)
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
