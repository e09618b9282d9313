-- Moves the namespace clock (see advance_of.lua).
-- KEYS[1] the namespace's meta hash. ARGV[1] the clock the caller knows, ARGV[2] the step (0:
-- only raise it to ARGV[1]; 1: a deleteByTag takes the next value).
-- Returns the clock now.
return advance(KEYS[1], ARGV[1], ARGV[2])
