-- A background refresh's claim on a key: take the lock, and if taken return the envelope and
-- the key's fence (see envelope_fence) as they are now.
-- KEYS[1] value key, KEYS[2] lock key (one hash tag: one cluster slot).
-- ARGV[1] lock token, ARGV[2] lockTtl (ms), ARGV[3] a marker and ARGV[4] its px (see
-- envelope_fence), ARGV[5] the caller's mark (returned last, see `invoke_marked`).
-- Returns {1, value or false, fence, mark} when ARGV[1] now holds the lock, else {0, mark}.
-- A caller that finds the lock held leaves the load to its holder and keeps serving its copy
-- until the holder's announcement: when the key holds a marker (Redis lost the value the caller
-- has a copy of, and the holder's is a cold load), the marker is flagged as waited on, as a cold
-- waiter flags it (cold_gate.lua), so the write-back that replaces it announces the key.
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  -- A lock left with no expiry would hold every refresh of the key back forever.
  if redis.call('PTTL', KEYS[2]) == -1 then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
  local head = redis.pcall('GETRANGE', KEYS[1], 0, 1)
  if envelope_marker(head) and not envelope_waited(head) then
    redis.call('SETRANGE', KEYS[1], 1, string.char(bit.bor(string.byte(head, 2), ENVELOPE_WAITED)))
  end
  return {0, ARGV[5]}
end
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' then value = false end
return {1, value, envelope_fence(KEYS[1], value, ARGV[3], ARGV[4]), ARGV[5]}
