'use strict'
// The binary envelope (src/envelope.rs `layout`) read from the bytes Redis holds, for tests that
// look at what the cache wrote. `envelopeJson` renders one as the JSON layout earlier versions
// wrote (which the cache still reads), so a test can `JSON.parse(raw).value` either.

const MAGIC = 0xc5
// The same header with madeAt (when the key's last set or delete was made) at 40-45.
const MAGIC_TIMED = 0xc6
const FIXED = 40
const FLAGS = { negative: 0x01, undefined: 0x02, tagged: 0x04, retry: 0x08, marker: 0x10, compressed: 0x20 }
const FMTS = [null, 'v8', 'custom', 'custom-b64']

const u48 = (b, at) => b.readUIntBE(at, 6)

/** An LZ4 block (the format lz4_flex writes) decompressed into `size` bytes. */
function lz4Block(src, size) {
  const out = Buffer.alloc(size)
  let i = 0
  let o = 0
  while (i < src.length) {
    const token = src[i++]
    let literals = token >> 4
    if (literals === 15) {
      let b
      do {
        b = src[i++]
        literals += b
      } while (b === 255)
    }
    src.copy(out, o, i, i + literals)
    i += literals
    o += literals
    if (i >= src.length) break
    const offset = src[i] | (src[i + 1] << 8)
    i += 2
    let match = (token & 15) + 4
    if ((token & 15) === 15) {
      let b
      do {
        b = src[i++]
        match += b
      } while (b === 255)
    }
    for (let k = 0; k < match; k++, o++) out[o] = out[o - offset]
  }
  if (o !== size) throw new Error(`lz4: ${o} bytes, ${size} declared`)
  return out
}

/** The fields of a binary envelope, or null when `buf` is not one. */
function decodeEnvelope(buf) {
  if (!Buffer.isBuffer(buf) || buf.length < FIXED || (buf[0] !== MAGIC && buf[0] !== MAGIC_TIMED)) return null
  const timed = buf[0] === MAGIC_TIMED
  if (timed && buf.length < FIXED + 6) return null
  const flags = buf[1]
  const out = {
    sc: 1,
    gen: buf.subarray(10, 18).toString('hex'),
    born: u48(buf, 18),
    kh: buf.subarray(2, 10).toString('hex'),
    freshUntil: u48(buf, 24),
    hardUntil: u48(buf, 30),
    computeMs: buf.readUInt32BE(36) / 1000,
    retryAfter: 0,
  }
  let at = FIXED
  if (timed) {
    out.madeAt = u48(buf, at)
    at += 6
  }
  if (flags & FLAGS.retry) {
    out.retryAfter = u48(buf, at)
    at += 6
  }
  if (flags & FLAGS.negative) out.negative = true
  if (flags & FLAGS.undefined) out.undefined = true
  if (flags & FLAGS.marker) out.marker = true
  if (flags & FLAGS.compressed) out.compressed = true
  if (flags & FLAGS.tagged) {
    const len = buf.readUInt32BE(at)
    out.tags = JSON.parse(buf.toString('utf8', at + 4, at + 4 + len))
    at += 4 + len
  }
  const fmt = FMTS[flags >> 6]
  if (fmt) out.fmt = fmt
  out.valueText = out.compressed ? lz4Block(buf.subarray(at + 4), buf.readUInt32LE(at)).toString('utf8') : buf.toString('utf8', at)
  return out
}

/** `buf` as the JSON layout (see above) if it is a binary envelope, else as UTF-8 text. */
function envelopeJson(buf) {
  const e = decodeEnvelope(buf)
  if (e === null) return buf.toString('utf8')
  const { valueText, ...head } = e
  const value = e.marker || e.undefined ? 'null' : valueText
  return `${JSON.stringify(head).slice(0, -1)},"value":${value}}`
}

module.exports = { decodeEnvelope, envelopeJson, MAGIC, MAGIC_TIMED }
