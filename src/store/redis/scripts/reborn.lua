-- A set's entry was written born at the namespace clock its process knew, and Redis's clock was
-- ahead (a deleteByTag or clear elsewhere, not yet heard of there, but made before this set):
-- raises the entry's born to that clock, so it is not taken for older than them. Only while the
-- key still holds that set's entry (its generation); the expiry is kept.
-- KEYS[1] value key. ARGV[1] the set's generation, ARGV[2] the clock.
-- Returns 1 when raised, else 0.
local value = redis.pcall('GET', KEYS[1])
if not envelope_binary(value) or envelope_generation(value) ~= ARGV[1] then return 0 end
if envelope_born(value) >= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], envelope_with_born(value, tonumber(ARGV[2])), 'KEEPTTL')
return 1
