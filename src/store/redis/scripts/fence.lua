-- A forced load's fence: the key's state as the load begins, as write_back.lua computes it
-- (the generation key a set or delete wrote, and the generation inside the envelope).
-- KEYS[1] value key, KEYS[2] generation key (one hash tag: one cluster slot).
-- ARGV[1] a new generation and ARGV[2] its px, for a key that has none (a fence is never empty:
-- see cold_gate.lua).
-- Returns the fence string.
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' then value = '' end
local generation = redis.call('GET', KEYS[2])
if not generation then
  generation = ARGV[1]
  redis.call('SET', KEYS[2], generation, 'PX', ARGV[2])
end
return generation .. '/' .. (string.match(value, '^{"sc":1,"gen":"(%w*)"') or '')
