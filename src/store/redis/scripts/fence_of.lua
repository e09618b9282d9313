-- Prepended to the gate scripts (cold_gate, refresh_gate, fence): a load's fence, the key's state
-- as the load begins, as write_back.lua computes it: the generation key a set or delete wrote and
-- the generation inside the envelope. A fence is never empty: a key with no generation gets
-- `new_generation` (for `px` ms) now, since an empty fence would match again after Redis lost the
-- key's state (a restart without persistence, a failover that lost writes), and a load begun
-- before a set that was lost would be written over it.
local function fence_of(value, generation_key, new_generation, px)
  local generation = redis.call('GET', generation_key)
  if not generation then
    generation = new_generation
    redis.call('SET', generation_key, generation, 'PX', px)
  end
  return generation .. '/' .. (value and string.match(value, '^{"sc":1,"gen":"(%w*)"') or '')
end

