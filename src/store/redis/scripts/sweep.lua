-- Part of clear: deletes one value key if the entry in it was born before the clear (read from
-- its header, or an old JSON envelope's third field). An entry written since (a set, or a load
-- that began after the clear) stays; so does a key of another Redis type.
-- KEYS[1] value key. ARGV[1] the clear's clock.
-- Returns 1 when deleted, else 0.
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' then return 0 end
if envelope_born(value) < tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
