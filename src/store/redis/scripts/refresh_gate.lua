-- A background refresh's claim on a key: take the lock, and if taken return the envelope and
-- the key's fence (see write_back.lua) as they are now.
-- KEYS[1] value key, KEYS[2] lock key, KEYS[3] generation key (one hash tag: one cluster slot).
-- ARGV[1] lock token, ARGV[2] lockTtl (ms), ARGV[3] a new generation and ARGV[4] its px, for a
-- key that has none (see fence_of.lua).
-- Returns {1, value or false, fence} when ARGV[1] now holds the lock, else {0}.
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- A lock left with no expiry would hold every refresh of the key back forever.
  if redis.call('PTTL', KEYS[2]) == -1 then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
  return {0}
end
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' then value = false end
local fence = fence_of(value, KEYS[3], ARGV[3], ARGV[4])
return {1, value, fence}
