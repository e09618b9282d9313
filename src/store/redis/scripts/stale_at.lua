-- Prepended to expire.lua. The one place a script rewrites an envelope's freshUntil: `value` with
-- its freshness ended at `now` (epoch ms); nil when it is not an envelope this reads or is stale
-- already (then it stays as it is); false for a not-found, which has no value to serve stale (it
-- goes, so the next read loads). The header's layout is envelope.rs's `encode`: its fields come
-- before `,"value":`, which cannot occur in them.
local function stale_at(value, now)
  local head, fresh = string.match(value, '^({"sc":1,[^{}]-"freshUntil":)(%d+)')
  if not head then return nil end
  local meta = string.sub(value, 1, string.find(value, ',"value":', 1, true) or 0)
  if string.find(meta, ',"negative":true', 1, true) then return false end
  if tonumber(fresh) <= tonumber(now) then return nil end
  return head .. now .. string.sub(value, #head + #fresh + 1)
end

