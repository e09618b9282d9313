-- deleteByTag or expireByTag of any number of tags in one atomic step, where every key lives on
-- one server (no Cluster): takes the next namespace clock, records it at every tag's record key
-- (see tag_record.lua) and announces each tag. A long list is never partly applied: Redis runs
-- all of it or, failing before it ran, none.
-- KEYS[1] the namespace's meta hash, KEYS[2..] the tags' record keys. ARGV[1] the clock the
-- caller knows, ARGV[2] the records' px, ARGV[3] channel, ARGV[4] the messages' prefix (the clock
-- and a tag follow it), ARGV[5..] the tags, in the order of KEYS[2..].
-- Returns the clock.
local clock = advance(KEYS[1], ARGV[1], 1)
for i = 2, #KEYS do
  record_tag(KEYS[i], clock, ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[4] .. clock .. ' ' .. ARGV[i + 3])
end
return clock
