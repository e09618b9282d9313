-- A forced load's fence: the key's state as the load begins (see envelope_fence).
-- KEYS[1] value key. ARGV[1] a marker and ARGV[2] its px (see envelope_fence), ARGV[3] the
-- caller's mark (returned last, see `invoke_marked`).
-- Returns {fence, mark}.
local value = redis.pcall('GET', KEYS[1])
return {envelope_fence(KEYS[1], value, ARGV[1], ARGV[2]), ARGV[3]}
