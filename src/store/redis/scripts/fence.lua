-- A forced load's fence: the key's state as the load begins, as write_back.lua computes it
-- (the generation key a set or delete wrote, and the generation inside the envelope).
-- KEYS[1] value key, KEYS[2] generation key (one hash tag: one cluster slot).
-- ARGV[1] a new generation and ARGV[2] its px, for a key that has none (see fence_of.lua).
-- Returns the fence string.
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' then value = '' end
return fence_of(value, KEYS[2], ARGV[1], ARGV[2])
