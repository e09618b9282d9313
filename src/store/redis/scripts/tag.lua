-- deleteByTag of one tag: records at the tag's key the namespace clock the deletion was given
-- (only ever forward), so an entry carrying the tag and born before that clock reads as dead in
-- every process, then announces it so in-process copies die too. No entry is touched: the cost
-- is one key whatever the number of entries carrying the tag.
-- KEYS[1] tag key (its own cluster slot). ARGV[1] the clock (from HINCRBY <ns>:meta clock),
-- ARGV[2] channel, ARGV[3] message.
-- Returns 1.
local current = redis.pcall('GET', KEYS[1])
if type(current) ~= 'string' or (tonumber(current) or 0) < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
