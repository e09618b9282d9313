-- set and delete: the newest state of a key, whatever loads are running. A new generation key
-- changes the key's fence (see write_back.lua), which drops every load that began before; it
-- outlives a deleted value, so a delete is remembered as long as a load may run.
-- KEYS[1] value key, KEYS[2] generation key (one hash tag: one cluster slot).
-- ARGV[1] envelope ('' to delete), ARGV[2] its px, ARGV[3] new generation, ARGV[4] the
-- generation key's px, ARGV[5] channel, ARGV[6] message.
-- Returns 1 when the value key existed before, else 0.
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
local existed = redis.call('EXISTS', KEYS[1])
if ARGV[1] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
redis.call('PUBLISH', ARGV[5], ARGV[6])
return existed
