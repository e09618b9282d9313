-- expire(key): the entry keeps its value and its expiry (hardTtl) but is stale from now on. A new
-- generation changes the key's fence (see write_back.lua), as set and delete do, so a load that
-- began before never writes its result: it may carry what the expire was about. The
-- announcement drops other processes' in-process copies; their next read finds this stale
-- envelope, is served it at once and starts the one refresh (the lock). A not-found goes (see
-- stale_at.lua).
-- KEYS[1] value key, KEYS[2] generation key (one hash tag: one cluster slot).
-- ARGV[1] now (epoch ms, whole), ARGV[2] new generation, ARGV[3] the generation key's px,
-- ARGV[4] channel, ARGV[5] message.
-- Returns 1 when the value key existed, else 0.
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
local value = redis.pcall('GET', KEYS[1])
local existed = 0
if type(value) == 'string' then
  existed = 1
  local ended = stale_at(value, ARGV[1])
  if ended then
    redis.call('SET', KEYS[1], ended, 'KEEPTTL')
  elseif ended == false then
    redis.call('DEL', KEYS[1])
  end
end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return existed
