'use strict'
// The value codecs: the serializer option (`'json'`, `'v8'` or a user's { serialize, deserialize }),
// as what every tier keeps of a value and how a value is read back from Redis.
const native = require('../binding.js')
const { isMap, isSet } = require('node:util/types')
const { invalidOption, notSerializable } = require('./errors.js')

// node:v8 is loaded when the v8 serializer is first used: loading it took 2 ms of a cold
// process's first read (about a fifth of it), for a serializer most caches never use.
let v8Module
const v8 = () => (v8Module ??= require('node:v8'))

// How a value is written in the Redis envelope.
const { FMT_JSON, FMT_V8, FMT_TEXT, FMT_BYTES } = native
/** What decoding a Redis value returns when this cache's serializer cannot read it. */
const UNREADABLE = Symbol('unreadable')

// A serializer, as a codec. `encode(value)` returns what every tier keeps of a value: `text`
// (the JSON text embedded in the Redis envelope), `stored` (the copy cached in process and handed
// to every caller: deserialize(serialize(value)), so a hit returns the same in every tier),
// `size` (serialized bytes, for l1.maxBytes and stats) and `fmt` (the envelope's format marker).
// `decode(text, fmt)` reads a value back from Redis, and throws if it cannot.

// A Map or Set at the top is a value JSON would silently store as {} (one nested inside an object
// is JSON's to decide, as JSON.stringify decides it); one with a toJSON of its own says how.
function jsonCollection(value) {
  if (typeof value !== 'object' || value === null || typeof value.toJSON === 'function') return null
  if (isMap(value)) return 'Map'
  if (isSet(value)) return 'Set'
  return null
}

// JSON semantics: what a hit returns equals JSON.parse(JSON.stringify(value)).
const JSON_CODEC = {
  kind: 'json',
  fmt: FMT_JSON,
  encode(value) {
    const collection = jsonCollection(value)
    if (collection !== null) {
      const instead = collection === 'Map' ? 'Object.fromEntries(map)' : '[...set]'
      throw notSerializable(
        `a ${collection} cannot be stored as JSON (it would read back as {}): pass serializer: 'v8' to the StampedeCache constructor, which keeps Maps and Sets, or store ${instead}`,
      )
    }
    let json
    try {
      json = JSON.stringify(value)
    } catch (cause) {
      throw notSerializable(`the value cannot be stored as JSON: ${cause.message}`, cause)
    }
    if (json === undefined) throw notSerializable(`the value cannot be stored as JSON (a ${typeof value} at the top)`)
    return { text: json, stored: JSON.parse(json), size: Buffer.byteLength(json), fmt: FMT_JSON }
  },
  decode(text) {
    return JSON.parse(text)
  },
}

// node:v8 structured serialization (Date, Map, Set, BigInt, typed arrays, Buffers, cycles); in
// Redis as a JSON string of base64, so the envelope stays readable JSON.
const V8_CODEC = {
  kind: 'v8',
  fmt: FMT_V8,
  encode(value) {
    let bytes
    try {
      bytes = v8().serialize(value)
    } catch (cause) {
      throw notSerializable(`the value cannot be stored with the v8 serializer: ${cause.message}`, cause)
    }
    return { text: `"${bytes.toString('base64')}"`, stored: v8().deserialize(bytes), size: bytes.length, fmt: FMT_V8 }
  },
  decode(text) {
    return v8().deserialize(Buffer.from(JSON.parse(text), 'base64'))
  },
}

// A user's { serialize, deserialize } (superjson, msgpack, ...): a string is kept as a JSON
// string, bytes as base64.
function customCodec(serializer) {
  const { serialize, deserialize } = serializer
  const roundTrip = (data) => {
    try {
      return deserialize.call(serializer, data)
    } catch (cause) {
      throw notSerializable(`the serializer could not read back what it wrote: ${cause?.message ?? cause}`, cause)
    }
  }
  return {
    kind: 'custom',
    fmt: FMT_TEXT,
    encode(value) {
      let data
      try {
        data = serialize.call(serializer, value)
      } catch (cause) {
        throw notSerializable(`the serializer could not serialize the value: ${cause?.message ?? cause}`, cause)
      }
      if (typeof data === 'string') {
        return { text: JSON.stringify(data), stored: roundTrip(data), size: Buffer.byteLength(data), fmt: FMT_TEXT }
      }
      if (data instanceof Uint8Array) {
        const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength)
        return { text: `"${bytes.toString('base64')}"`, stored: roundTrip(data), size: data.byteLength, fmt: FMT_BYTES }
      }
      throw notSerializable(`serializer.serialize must return a string or a Uint8Array, got ${data === null ? 'null' : typeof data}`)
    },
    decode(text, fmt) {
      const data = JSON.parse(text)
      return deserialize.call(serializer, fmt === FMT_BYTES ? Buffer.from(data, 'base64') : data)
    },
  }
}

function codecOf(serializer) {
  if (serializer === undefined || serializer === 'json') return JSON_CODEC
  if (serializer === 'v8') return V8_CODEC
  if (typeof serializer === 'object' && serializer !== null && typeof serializer.serialize === 'function' && typeof serializer.deserialize === 'function') {
    return customCodec(serializer)
  }
  throw invalidOption('serializer', "must be 'json', 'v8' or { serialize(value), deserialize(data) }")
}

// What every tier keeps of a loaded or set value (see the codecs). null and undefined
// (not-found markers) skip the serializer and stay as they are.
function toStored(codec, value) {
  if (value === null) return { text: 'null', stored: null, size: 4, fmt: codec.fmt }
  if (value === undefined) return { text: undefined, stored: undefined, size: 0, fmt: codec.fmt }
  return codec.encode(value)
}

module.exports = { UNREADABLE, codecOf, toStored }
