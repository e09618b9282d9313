-- A forced load's fence: the key's state as the load begins, as write_back.lua computes it
-- (the generation key a set or delete wrote, and the generation inside the envelope).
-- KEYS[1] value key, KEYS[2] generation key (one hash tag: one cluster slot).
-- Returns the fence string.
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' then value = '' end
return (redis.call('GET', KEYS[2]) or '') .. '/' .. (string.match(value, '^{"sc":1,"gen":"(%w*)"') or '')
