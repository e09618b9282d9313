-- deleteByTag or expireByTag of one tag (on a Cluster, where each tag has its own slot): records
-- at the tag's record key the namespace clock the call was given (see tag_record.lua), so an
-- entry carrying the tag and born before that clock reads as dead (deleteByTag) or stale
-- (expireByTag) in every process, then announces it so in-process copies follow. No entry is
-- touched: the cost is one key whatever the number of entries carrying the tag.
-- KEYS[1] the tag's record key: its deleteByTag key, or for an expireByTag its stale key, then
-- KEYS[2] its deleteByTag key (one hash tag: one cluster slot). ARGV[1] the clock (from the
-- namespace clock), ARGV[2] channel, ARGV[3] message, ARGV[4] the record's px; for an
-- expireByTag ARGV[5] the window's end (epoch ms, '-' for none) and ARGV[6] now (epoch ms).
-- Returns 1.
if #KEYS == 2 then
  record_stale(KEYS[1], KEYS[2], ARGV[1], ARGV[5], ARGV[6], ARGV[4])
else
  record_tag(KEYS[1], ARGV[1], ARGV[4])
end
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
