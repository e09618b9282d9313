-- set and delete: the newest state of a key, whatever loads are running. The new envelope has a
-- new generation, which drops every load that began before (see write_back.lua); a delete
-- removes the value or the marker a load is fenced by (see envelope_fence), and an absent key
-- matches no fence: nothing needs to outlive a delete. The generation key earlier versions
-- fenced loads by is removed, so their loads still running during a rolling deploy are dropped
-- by this write too.
-- A replayed change (one Redis could not take when it was made) is applied only if the key holds
-- no change made at or after it: a set's envelope names when it was made (madeAt, see
-- envelope_made_at), and a load's write over it keeps that. An absent key holds none (a
-- delete leaves nothing behind to say when it was made). A replayed set then applies only if the
-- key is as its instance knew it when the set was made (ARGV[7], see envelope_as_expected): the
-- very write it held, or nothing. Found changed in a way that instance did not see (a delete
-- and a load since, another write, an expiry, a marker), the key is deleted and announced
-- instead, as a delete would: every instance's next read loads it from the source of truth.
-- KEYS[1] value key, KEYS[2] the earlier versions' generation key (one hash tag: one cluster
-- slot).
-- ARGV[1] envelope ('' to delete), ARGV[2] its px, ARGV[3] channel, ARGV[4]
-- message, ARGV[5] the caller's mark (returned last, see `invoke_marked`), ARGV[6] '' for a
-- change made now, or the epoch ms a replayed change was made at, ARGV[7] for a replayed set what
-- it expects of the key (see envelope_as_expected; ignored otherwise).
-- Returns {1 when the key held a value before (a marker is none), else 0; -1 when a replayed
-- change is older than the key's last (nothing done, nothing announced); -2 when a replayed set
-- found the key changed (deleted and announced instead), mark}.
local head = redis.pcall('GETRANGE', KEYS[1], 0, ENVELOPE_TIMED_FIXED - 1)
if ARGV[6] ~= '' then
  if envelope_made_at(head) >= tonumber(ARGV[6]) then return {-1, ARGV[5]} end
  if ARGV[1] ~= '' and not envelope_as_expected(KEYS[1], head, ARGV[7]) then
    redis.call('DEL', KEYS[1], KEYS[2])
    redis.call('PUBLISH', ARGV[3], ARGV[4])
    return {-2, ARGV[5]}
  end
end
local existed = 0
if type(head) == 'string' then
  if #head > 0 and not envelope_marker(head) then existed = 1 end
elseif redis.call('EXISTS', KEYS[1]) == 1 then
  existed = 1
end
if ARGV[1] == '' then
  redis.call('DEL', KEYS[1], KEYS[2])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('DEL', KEYS[2])
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return {existed, ARGV[5]}
