-- Writes a load's result, unless something newer happened to the key since the load began.
-- The key's fence is its generation key (written by set and delete, so it outlives a delete)
-- and the generation inside its envelope (new with every write, a load's included): the fence
-- changes whenever anything is written to the key, so a load whose lock expired and was taken
-- over is dropped once the new holder has written, even after it released the lock. A forced
-- load (forceRefresh) began after any load still running: only a set or delete since drops it.
-- Releases the writer's lock either way, and announces the key so other processes drop their
-- copies and lock waiters look again.
-- KEYS[1] value key, KEYS[2] lock key, KEYS[3] generation key (one hash tag: one cluster slot).
-- ARGV[1] envelope (with a new generation inside), ARGV[2] its px, ARGV[3] lock token ('' when
-- the load holds none), ARGV[4] the fence read when the load began, ARGV[5] '1' for a forced
-- load, ARGV[6] channel, ARGV[7] message.
-- Returns 1 when written, 0 when dropped.
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' then value = '' end
local generation = redis.call('GET', KEYS[3]) or ''
local fence = generation .. '/' .. (string.match(value, '^{"sc":1,"gen":"(%w*)"') or '')
local moved
if ARGV[5] == '1' then
  moved = generation .. '/' ~= string.match(ARGV[4], '^[^/]*/')
else
  moved = fence ~= ARGV[4]
end
if moved then
  if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[6], ARGV[7]) end
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('PUBLISH', ARGV[6], ARGV[8])
return 1
