-- Prepended to every script that reads an envelope's fields: the one place the Lua side knows
-- the layout (src/envelope.rs `layout` is the Rust side's). The binary layout begins with the
-- byte 0xC5 and keeps its fields at fixed offsets (1-based here): flags at 2, the key's mark at
-- 3-10, the generation at 11-18, born at 19-24 (6 bytes, big-endian), freshUntil at 25-30,
-- hardUntil at 31-36; a timed header (first byte 0xC6) has madeAt, when the key's last set was
-- made (epoch ms), at 41-46, before the rest. Envelopes earlier versions wrote are
-- JSON: '{"sc":1,"gen":"..","born":N,..'.
local ENVELOPE_MAGIC = '\197'
local ENVELOPE_TIMED = '\198'
local ENVELOPE_FIXED = 40
local ENVELOPE_TIMED_FIXED = 46
local ENVELOPE_MARKER = 16
local ENVELOPE_NEGATIVE = 1
-- On a marker (which has no value, so no use for the value's flags): a lock waiter looked at it
-- (see cold_gate.lua), so the write-back that replaces it announces the key.
local ENVELOPE_WAITED = 2

-- Whether `value` (an envelope or its first bytes) begins with a binary header's first byte.
local function envelope_magic(value)
  if type(value) ~= 'string' then return false end
  local first = string.sub(value, 1, 1)
  return first == ENVELOPE_MAGIC or first == ENVELOPE_TIMED
end

local function envelope_binary(value)
  return envelope_magic(value) and #value >= ENVELOPE_FIXED
end

-- When the key's last set was made, as `value` (an envelope, or its first
-- ENVELOPE_TIMED_FIXED bytes) names it; 0 for none (untimed, absent, foreign, old JSON).
local function envelope_made_at(value)
  if type(value) ~= 'string' or #value < ENVELOPE_TIMED_FIXED
    or string.sub(value, 1, 1) ~= ENVELOPE_TIMED then return 0 end
  return (struct.unpack('>I6', value, ENVELOPE_FIXED + 1))
end

-- The write that made `value`: 8 bytes, or the old JSON's gen; '' for none (absent, foreign).
local function envelope_generation(value)
  if envelope_binary(value) then return string.sub(value, 11, 18) end
  if type(value) ~= 'string' then return '' end
  return string.match(value, '^{"sc":1,"gen":"(%w*)"') or ''
end

-- The namespace clock `value` was born at (0 for none).
local function envelope_born(value)
  if envelope_binary(value) then return (struct.unpack('>I6', value, 19)) end
  if type(value) ~= 'string' then return 0 end
  return tonumber(string.match(value, '^{"sc":1,"gen":"%w*","born":(%d+)') or '0') or 0
end

-- `value` with its born set to `born` (binary layout only).
local function envelope_with_born(value, born)
  return string.sub(value, 1, 18) .. struct.pack('>I6', born) .. string.sub(value, 25)
end

-- Whether `head` (an envelope or its first bytes) is a marker: a generation without a value.
local function envelope_marker(head)
  return envelope_magic(head) and #head >= 2
    and bit.band(string.byte(head, 2), ENVELOPE_MARKER) ~= 0
end

-- Whether `head` (an envelope or its first bytes) is a marker a lock waiter flagged.
local function envelope_waited(head)
  return envelope_marker(head) and bit.band(string.byte(head, 2), ENVELOPE_WAITED) ~= 0
end

-- Whether `key`, whose value begins with `head` (its first bytes, or a pcall's error for another
-- type), holds what `expected` says a replayed set expects: 'k' and a write's identity (the
-- header's bytes 3-10 and 19-40, see src/envelope/identity.rs) for that very write (either
-- binary layout, no marker); 'a', or 'u' (nothing known; also when missing), for no key at all;
-- 'c' and a clear's clock for no key or an entry born before that clock (binary, dead by it).
-- Anything else is not provably expected: an old JSON envelope, a marker, another write.
local function envelope_as_expected(key, head, expected)
  if expected == nil or expected == 'a' or expected == 'u' then
    return redis.call('EXISTS', key) == 0
  end
  if string.sub(expected, 1, 1) == 'c' then
    if redis.call('EXISTS', key) == 0 then return true end
    return envelope_binary(head) and not envelope_marker(head)
      and envelope_born(head) < (tonumber(string.sub(expected, 2)) or 0)
  end
  if string.sub(expected, 1, 1) ~= 'k' or #expected ~= 31 then return false end
  return envelope_binary(head) and not envelope_marker(head)
    and string.sub(head, 3, 10) == string.sub(expected, 2, 9)
    and string.sub(head, 19, ENVELOPE_FIXED) == string.sub(expected, 10, 31)
end

-- `value` (a load's result: binary, untimed) carrying what `current`, the key's envelope it
-- replaces, holds of the key's last set or delete: the set part of its generation (first 4
-- bytes, see `Generation`) and, if timed, the madeAt of the key's last set. An old JSON envelope has neither.
local function envelope_carrying(value, current)
  if not envelope_binary(current) then return value end
  local timed = envelope_made_at(current) > 0
  -- The writer drew its set part from its fence (`load_generation`): then, untimed, there is
  -- nothing to carry, and the value is written as given, not copied.
  if not timed and string.sub(current, 11, 14) == string.sub(value, 11, 14) then return value end
  local middle = string.sub(value, 2, 10) .. string.sub(current, 11, 14)
    .. string.sub(value, 15, ENVELOPE_FIXED)
  if timed then
    return ENVELOPE_TIMED .. middle .. string.sub(current, ENVELOPE_FIXED + 1, ENVELOPE_TIMED_FIXED)
      .. string.sub(value, ENVELOPE_FIXED + 1)
  end
  return string.sub(value, 1, 1) .. middle .. string.sub(value, ENVELOPE_FIXED + 1)
end

-- expire: `value` stale from `now` (epoch ms: its freshUntil at most that) under a new
-- `generation` (8 bytes, all new as a set draws them, so a load fenced by `value` is dropped,
-- a forced one too). An old JSON envelope keeps its layout, for the builds that read only that:
-- its gen becomes the generation in hex, the first digit moved off the old one's so its set part
-- (its first 4 characters) changes too. nil when `value` is no envelope (it stays as it is);
-- false when it has no value to serve stale: a marker (a load running on a key with no value)
-- or a not-found. Those go: an absent key matches no fence, and the next read loads.
local function envelope_expired(value, now, generation)
  now = tonumber(now)
  if envelope_binary(value) then
    if envelope_marker(value) or bit.band(string.byte(value, 2), ENVELOPE_NEGATIVE) ~= 0 then
      return false
    end
    local fresh = math.min((struct.unpack('>I6', value, 25)), now)
    return string.sub(value, 1, 10) .. generation .. string.sub(value, 19, 24)
      .. struct.pack('>I6', fresh) .. string.sub(value, 31)
  end
  if type(value) ~= 'string' then return nil end
  local old = string.match(value, '^{"sc":1,"gen":"(%w*)"')
  if not old then return nil end
  local meta = string.sub(value, 1, string.find(value, ',"value":', 1, true) or #value)
  if string.find(meta, ',"negative":true', 1, true) then return false end
  local gen = (string.gsub(generation, '.', function(c) return string.format('%02x', string.byte(c)) end))
  if string.sub(gen, 1, 1) == string.sub(old, 1, 1) then
    gen = (string.sub(old, 1, 1) == 'g' and 'h' or 'g') .. string.sub(gen, 2)
  end
  value = '{"sc":1,"gen":"' .. gen .. string.sub(value, 16 + #old)
  local head, fresh = string.match(value, '^({"sc":1,[^{}]-"freshUntil":)([%d%.eE%+%-]+)')
  if not head or (tonumber(fresh) or 0) <= now then return value end
  return head .. string.format('%d', now) .. string.sub(value, #head + #fresh + 1)
end

-- `value` (binary) carrying the set part (first 4 bytes, see `Generation`) of `generation`
-- when that is a binary envelope's; an old JSON envelope's generation has none to carry.
local function envelope_with_set_part(value, generation)
  if #generation ~= 8 then return value end
  return string.sub(value, 1, 10) .. string.sub(generation, 1, 4) .. string.sub(value, 15)
end

-- A load's fence: the generation of `value`, the key's envelope as the load begins. A key that
-- holds none (absent, a foreign value) is given `marker`, a header with a new generation and no
-- value, for `px` ms, so its fence is that: a delete since (which removes it) or any write
-- (which replaces it) drops the load. Never '': an absent key matches no fence.
local function envelope_fence(key, value, marker, px)
  local generation = envelope_generation(value)
  if generation ~= '' then return generation end
  redis.call('SET', key, marker, 'PX', px)
  return envelope_generation(marker)
end

