-- Releases a lock only while it still holds the caller's token, so a holder whose lock expired
-- can never delete the next holder's; then announces the key (if asked) so processes waiting
-- for the lock look again at once instead of at its expiry. A load that ends without writing
-- (failed, timed out, superseded) leaves no marker behind (see envelope_fence): one the key
-- holds while the lock was the caller's is removed with it.
-- KEYS[1] lock key, KEYS[2] value key (one hash tag: one cluster slot). ARGV[1] token, ARGV[2]
-- channel ('' for none), ARGV[3] message, ARGV[4] the caller's mark (returned last, see
-- `invoke_marked`).
-- Returns {1 when the lock was the caller's, else 0, mark}.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if envelope_marker(redis.pcall('GETRANGE', KEYS[2], 0, 1)) then redis.call('DEL', KEYS[2]) end
  if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
  return {1, ARGV[4]}
end
return {0, ARGV[4]}
