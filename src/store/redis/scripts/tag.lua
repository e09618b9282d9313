-- deleteByTag or expireByTag of one tag (on a Cluster, where each tag has its own slot): records
-- at the tag's record key the namespace clock the call was given (see tag_record.lua), so an
-- entry carrying the tag and born before that clock reads as dead (deleteByTag) or stale
-- (expireByTag) in every process, then announces it so in-process copies follow. No entry is
-- touched: the cost is one key whatever the number of entries carrying the tag.
-- KEYS[1] the tag's record key (its own cluster slot). ARGV[1] the clock (from HINCRBY
-- <ns>:meta clock), ARGV[2] channel, ARGV[3] message, ARGV[4] the record's px.
-- Returns 1.
record_tag(KEYS[1], ARGV[1], ARGV[4])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
