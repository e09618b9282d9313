-- set and delete: the newest state of a key, whatever loads are running. A new generation key
-- changes the key's fence (see write_back.lua), which drops every load that began before; it
-- outlives a deleted value, so a delete is remembered as long as a load may run.
-- A replayed change (one Redis could not take when it was made) is applied only if the key holds
-- no change made at or after it: a set's or delete's generation names when it was made
-- (`t` and 13 digits of epoch ms, see `timed_generation`), in the generation key and in the
-- envelope a set wrote.
-- KEYS[1] value key, KEYS[2] generation key (one hash tag: one cluster slot).
-- ARGV[1] envelope ('' to delete), ARGV[2] its px, ARGV[3] new generation, ARGV[4] the
-- generation key's px, ARGV[5] channel, ARGV[6] message, ARGV[7] '' for a change made now, or
-- the epoch ms a replayed change was made at.
-- Returns 1 when the value key existed before, else 0; -1 when a replay was older (nothing done).
local function made_at(generation)
  if type(generation) ~= 'string' then return 0 end
  return tonumber(string.match(generation, '^t(' .. string.rep('%d', 13) .. ')') or '0')
end
if ARGV[7] ~= '' then
  local value = redis.pcall('GET', KEYS[1])
  local inside = type(value) == 'string' and string.match(value, '^{"sc":1,"gen":"(%w*)"') or nil
  local newest = math.max(made_at(redis.pcall('GET', KEYS[2])), made_at(inside))
  if newest >= tonumber(ARGV[7]) then return -1 end
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
local existed = redis.call('EXISTS', KEYS[1])
if ARGV[1] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
redis.call('PUBLISH', ARGV[5], ARGV[6])
return existed
