-- Releases a lock only while it still holds the caller's token, so a holder whose lock expired
-- can never delete the next holder's; then announces the key (if asked) so processes waiting
-- for the lock look again at once instead of at its expiry.
-- KEYS[1] lock key. ARGV[1] token, ARGV[2] channel ('' for none), ARGV[3] message.
-- Returns 1 when the lock was the caller's, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
  return 1
end
return 0
