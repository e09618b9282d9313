-- Prepended to advance.lua and tags.lua: moves the namespace clock, never below what the caller
-- knows, then forward by a step. Redis may have lost the clock (a restart without persistence, a
-- failover that lost writes) while instances still know a later value and have entries born at
-- it: a deleteByTag or clear numbered below that would leave those entries alive.
-- `meta` the namespace's meta hash, `known` the clock the caller knows, `step` 0 (only raise it
-- to `known`) or 1 (a deleteByTag or expireByTag takes the next value). Returns the clock now.
local function advance(meta, known, step)
  local c = tonumber(redis.call('HGET', meta, 'clock') or '0') or 0
  known = tonumber(known)
  local moved = false
  if c < known then c = known; moved = true end
  step = tonumber(step)
  if step > 0 then c = c + step; moved = true end
  if moved then redis.call('HSET', meta, 'clock', c) end
  return c
end

