-- Writes a load's result, unless something newer happened to the key since the load began.
-- The key's fence is the generation inside its envelope, new with every write (a load's, a
-- set's): a load whose lock expired and was taken over is dropped once the new holder has
-- written, and one that began before a set or delete is dropped by it (a key that held no value
-- when the load began held a marker from then on, see envelope_fence; an absent key, or one that
-- Redis lost, matches no fence). A forced load (forceRefresh) began after any load still running: only a set
-- or delete since drops it, so it compares the generation's set part alone (its first 4 bytes,
-- which a load's write keeps); an absent key no longer has the set part it began with. The
-- written envelope also keeps the time the key's last set or delete was made (see
-- envelope_carrying), so a replayed change older than that is still refused (write.lua).
-- Releases the writer's lock either way (read with the key in one MGET, deleted only while it
-- holds the writer's token).
-- Announces the key so other processes drop their copies and lock waiters look again: always
-- when dropped holding a lock, and when written over a value. Written over a marker (the key
-- held no value, so no other process holds a copy of one), only when someone waits: a lock waiter
-- of this release flagged the marker (see cold_gate.lua), or one of the previous release, whose
-- gate fences by the generation key (KEYS[3]) and so has put one there.
-- KEYS[1] value key, KEYS[2] lock key, KEYS[3] the earlier versions' generation key (one hash
-- tag: one cluster slot).
-- ARGV[1] envelope (with a new generation inside), ARGV[2] its px, ARGV[3] lock token ('' when
-- the load holds none), ARGV[4] the fence read when the load began, ARGV[5] '1' for a forced
-- load, ARGV[6] channel, ARGV[7] message when dropped, ARGV[8] message when written (beginning
-- with the byte CARRIED_MESSAGE: the envelope written goes after it, see src/store/redis/
-- carried.rs), ARGV[9] the caller's mark (returned last, see `invoke_marked`).
-- Returns {1, 1 when announced else 0, mark} when written, {0, 1 when announced else 0, mark}
-- when dropped.
-- The first byte of a value-carrying announcement (CARRIED_MESSAGE in src/store/redis/carried.rs).
local CARRIED_MESSAGE = 254
local read = redis.call('MGET', KEYS[2], KEYS[1], KEYS[3])
if ARGV[3] ~= '' and read[1] == ARGV[3] then redis.call('DEL', KEYS[2]) end
-- MGET answers nil for a key of another type, as for an absent one.
local value = read[2]
if type(value) ~= 'string' then value = false end
local generation = envelope_generation(value)
local moved
if ARGV[5] == '1' then
  moved = generation == '' or string.sub(generation, 1, 4) ~= string.sub(ARGV[4], 1, 4)
else
  moved = generation == '' or generation ~= ARGV[4]
end
if moved then
  if ARGV[3] ~= '' then
    redis.call('PUBLISH', ARGV[6], ARGV[7])
    return {0, 1, ARGV[9]}
  end
  return {0, 0, ARGV[9]}
end
local written = envelope_carrying(ARGV[1], value)
redis.call('SET', KEYS[1], written, 'PX', ARGV[2])
if envelope_marker(value) and not envelope_waited(value) and not read[3] then
  return {1, 0, ARGV[9]}
end
local message = ARGV[8]
if string.byte(message, 1) == CARRIED_MESSAGE then message = message .. written end
redis.call('PUBLISH', ARGV[6], message)
return {1, 1, ARGV[9]}
