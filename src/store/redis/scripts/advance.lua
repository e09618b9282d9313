-- Moves the namespace clock: never below what the caller knows, then forward by a step. Redis
-- may have lost the clock (a restart without persistence, a failover that lost writes) while
-- instances still know a later value and have entries born at it: a deleteByTag or clear
-- numbered below that would leave those entries alive.
-- KEYS[1] the namespace's meta hash. ARGV[1] the clock the caller knows, ARGV[2] the step (0:
-- only raise it to ARGV[1]; 1: a deleteByTag takes the next value).
-- Returns the clock now.
local c = tonumber(redis.call('HGET', KEYS[1], 'clock') or '0') or 0
local known = tonumber(ARGV[1])
local moved = false
if c < known then c = known; moved = true end
local step = tonumber(ARGV[2])
if step > 0 then c = c + step; moved = true end
if moved then redis.call('HSET', KEYS[1], 'clock', c) end
return c
