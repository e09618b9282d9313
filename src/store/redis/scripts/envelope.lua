-- Prepended to every script that reads an envelope's fields: the one place the Lua side knows
-- the layout (src/envelope.rs `layout` is the Rust side's). The binary layout begins with the
-- byte 0xC5 and keeps its fields at fixed offsets (1-based here): flags at 2, the key's mark at
-- 3-10, the generation at 11-18, born at 19-24 (6 bytes, big-endian), freshUntil at 25-30,
-- hardUntil at 31-36. Envelopes earlier versions wrote are JSON: '{"sc":1,"gen":"..","born":N,..'.
local ENVELOPE_MAGIC = '\197'
local ENVELOPE_FIXED = 40
local ENVELOPE_MARKER = 16

local function envelope_binary(value)
  return type(value) == 'string' and #value >= ENVELOPE_FIXED
    and string.sub(value, 1, 1) == ENVELOPE_MAGIC
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
  return type(head) == 'string' and #head >= 2 and string.sub(head, 1, 1) == ENVELOPE_MAGIC
    and bit.band(string.byte(head, 2), ENVELOPE_MARKER) ~= 0
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

