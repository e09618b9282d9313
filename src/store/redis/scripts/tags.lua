-- deleteByTag or expireByTag of any number of tags in one atomic step, where every key lives on
-- one server (no Cluster): takes the next namespace clock, records it at every tag's record key
-- (see tag_record.lua) and announces each tag. A long list is never partly applied: Redis runs
-- all of it or, failing before it ran, none.
-- KEYS[1] the namespace's meta hash, then per tag its deleteByTag key, or for an expireByTag its
-- stale key and its deleteByTag key. ARGV[1] the clock the caller knows, ARGV[2] the records' px,
-- ARGV[3] channel, ARGV[4] the messages' prefix (then the clock, for an expireByTag the window's
-- end, and the tag), ARGV[5] '1' for an expireByTag, ARGV[6] the window's end (epoch ms, '-' for
-- none), ARGV[7] now (epoch ms), ARGV[8..] the tags, in the order of KEYS.
-- Returns the clock.
local clock = advance(KEYS[1], ARGV[1], 1)
local stale = ARGV[5] == '1'
local per = stale and 2 or 1
for i = 1, (#KEYS - 1) / per do
  local tag = ARGV[7 + i]
  if stale then
    local at = 2 + (i - 1) * 2
    record_stale(KEYS[at], KEYS[at + 1], clock, ARGV[6], ARGV[7], ARGV[2])
    redis.call('PUBLISH', ARGV[3], ARGV[4] .. clock .. ' ' .. ARGV[6] .. ' ' .. tag)
  else
    record_tag(KEYS[1 + i], clock, ARGV[2])
    redis.call('PUBLISH', ARGV[3], ARGV[4] .. clock .. ' ' .. tag)
  end
end
return clock
