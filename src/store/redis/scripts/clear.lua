-- clear: advances the namespace clock and records the new value as the clear clock, so every
-- entry born before it reads as dead in every process (and a load that began before it is born
-- too early to be kept), then announces it. The entries themselves are swept after (sweep.lua),
-- to free memory; correctness never waits for the sweep.
-- KEYS[1] the namespace's meta hash (fields clock, cleared). ARGV[1] channel, ARGV[2] message
-- prefix (the clock is appended), ARGV[3] the clock the caller knows (the clear's is later: see
-- advance.lua).
-- Returns the clear's clock.
local c = tonumber(redis.call('HGET', KEYS[1], 'clock') or '0') or 0
c = math.max(c, tonumber(ARGV[3])) + 1
redis.call('HSET', KEYS[1], 'clock', c, 'cleared', c)
redis.call('PUBLISH', ARGV[1], ARGV[2] .. c)
return c
