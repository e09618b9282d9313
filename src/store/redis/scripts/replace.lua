-- Replaces an envelope only if it is still the one read (compare-and-set), keeping its expiry:
-- records a failed refresh's retry-after without ever overwriting a newer value.
-- KEYS[1] value key. ARGV[1] the envelope read, ARGV[2] its replacement.
-- Returns 1 when replaced, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  return 1
end
return 0
