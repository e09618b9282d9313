-- Prepended to expire.lua. The one place a script rewrites an envelope's freshUntil: `value` with
-- its freshness ended at `now` (epoch ms), or nil when it is not an envelope this reads or is
-- stale already (then it stays as it is). The header's layout is envelope.rs's `encode`.
local function stale_at(value, now)
  local head, fresh = string.match(value, '^({"sc":1,[^{}]-"freshUntil":)(%d+)')
  if not head or tonumber(fresh) <= tonumber(now) then return nil end
  return head .. now .. string.sub(value, #head + #fresh + 1)
end

