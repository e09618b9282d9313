-- expire(key): the entry keeps its value and its expiry (hardTtl) but is stale from now on, under
-- a new generation (see envelope_expired): the key's fence changes as a set's or a delete's does
-- (see write_back.lua), so a load that began before, forced or not, never writes its result: it
-- may carry what the expire was about. The earlier versions' generation key goes, as in
-- write.lua, so their loads still running during a rolling deploy are dropped too. The
-- announcement drops other processes' in-process copies; their next read finds this stale
-- envelope, is served it at once and starts the one refresh (the lock). A not-found or a marker
-- goes (see envelope_expired).
-- KEYS[1] value key, KEYS[2] the earlier versions' generation key (one hash tag: one cluster
-- slot).
-- ARGV[1] now (epoch ms, whole), ARGV[2] the new generation (8 bytes), ARGV[3] channel, ARGV[4]
-- message, ARGV[5] the caller's mark (returned last, see `invoke_marked`).
-- Returns {1 when the key held a value (a marker is none), else 0, mark}.
local value = redis.pcall('GET', KEYS[1])
local existed = 0
if type(value) == 'string' then
  if not envelope_marker(value) then existed = 1 end
  local expired = envelope_expired(value, ARGV[1], ARGV[2])
  if expired then
    redis.call('SET', KEYS[1], expired, 'KEEPTTL')
  elseif expired == false then
    redis.call('DEL', KEYS[1])
  end
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  existed = 1
end
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return {existed, ARGV[5]}
