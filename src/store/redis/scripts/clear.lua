-- clear: advances the namespace clock and records the new value as the clear clock, so every
-- entry born before it reads as dead in every process (and a load that began before it is born
-- too early to be kept), then announces it. The entries themselves are swept after (sweep.lua),
-- to free memory; correctness never waits for the sweep.
-- KEYS[1] the namespace's meta hash (fields clock, cleared). ARGV[1] channel, ARGV[2] message
-- prefix (the clock is appended).
-- Returns the clear's clock.
local c = redis.call('HINCRBY', KEYS[1], 'clock', 1)
redis.call('HSET', KEYS[1], 'cleared', c)
redis.call('PUBLISH', ARGV[1], ARGV[2] .. c)
return c
