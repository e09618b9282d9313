-- A cold load's look at one key: its envelope if there is one, else the lock if it is free, else
-- how long the lock has left; with the key's fence (see envelope_fence) and the namespace clock
-- read in the same atomic step, so a load's fence is exactly the state it began from and its
-- result is born at the clock Redis had then.
-- KEYS[1] value key, KEYS[2] lock key (one hash tag: one cluster slot), KEYS[3] the namespace's
--   meta hash, only off a Cluster (another slot there: the caller reads the clock itself).
-- ARGV[1] lock token, ARGV[2] lockTtl (ms), ARGV[3] '0' to return a value the key holds; '1' to
--   take the lock even when a value is there (the caller found that value unusable: not ours, or
--   expired by its clock); '2' as '0', for a caller that has just found the key without a value
--   (a marker is put in its place at once, and the key read only if one was there), ARGV[4] a
--   marker and ARGV[5] its px (see envelope_fence), ARGV[6] the caller's mark, returned last:
--   the reply proves it is this call's (see `invoke_marked`).
-- Returns {value or false, fence, state, lock ms left, clock or false, mark}, state 0: value
--   found; 1: the lock is now ARGV[1]'s; 2: another holds it. A marker is no value. A lock with
--   no expiry is given lockTtl, so a stray key can never hold a waiter, or the key, forever.
-- A caller that finds the lock held (state 2) waits for the holder's announcement: the marker
--   the key holds is flagged (ENVELOPE_WAITED, in place: its generation and expiry stay), so the
--   write-back that replaces it announces the key (write_back.lua). A key that holds a value is
--   announced when replaced anyway.
local fence
-- What the key holds now, when that is what this look read or put there.
local held
if ARGV[3] == '2' and redis.call('SET', KEYS[1], ARGV[4], 'NX', 'PX', ARGV[5]) then
  fence = envelope_generation(ARGV[4])
  held = ARGV[4]
else
  local value = redis.pcall('GET', KEYS[1])
  if type(value) ~= 'string' then value = false end
  if value and ARGV[3] ~= '1' and not envelope_marker(value) then return {value, '', 0, 0, false, ARGV[6]} end
  fence = envelope_fence(KEYS[1], value, ARGV[4], ARGV[5])
  held = envelope_generation(value) == '' and ARGV[4] or value
end
local clock = false
if KEYS[3] then clock = redis.call('HGET', KEYS[3], 'clock') or '0' end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {false, fence, 1, 0, clock, ARGV[6]} end
local left = redis.call('PTTL', KEYS[2])
if left < 0 then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  left = tonumber(ARGV[2])
end
if envelope_marker(held) and not envelope_waited(held) then
  redis.call('SETRANGE', KEYS[1], 1, string.char(bit.bor(string.byte(held, 2), ENVELOPE_WAITED)))
end
return {false, fence, 2, left, clock, ARGV[6]}
