'use strict'
// The index of entries the engine proved fresh, so a fresh hit needs no native call: crossing
// into the addon cost more than the lookup itself (profiled: copying the key out of the JS
// string and hashing it again in Rust, plus the N-API call, against a Map.get whose string
// hash is cached). The engine decides what may be indexed and when it stops being so; this
// only remembers its answers, and forgets them all whenever the engine's epoch moves.
//
// The words are the engine's memory (src/fresh.rs): the epoch (bumped by any change that
// could make an answer here wrong, including an invalidation heard from another process, on
// the thread that hears it), `until` of the last hit the engine offered, and a touch log of
// the slots served here, which the engine applies to its LRU before it evicts anything.
const native = require('../binding.js')

const { freshIndex, applyTouches } = native
const { FRESH_EPOCH, FRESH_TOUCH_GEN, FRESH_UNTIL, FRESH_TOUCH_LEN, FRESH_TOUCHES, FRESH_TOUCH_CAP } = native

class FreshIndex {
  #id
  /** The engine's words, as 32-bit words and as f64s. */
  #words
  #until
  /** Slot by key, of the entries offered at `#epoch`. */
  #slots = new Map()
  #epoch
  /** Until when (exclusive, Date.now() ms) each slot's entry needs no decision. */
  #untils = []
  /** The touch generation at which each slot was last logged. */
  #marks = []
  /** Hits answered here (the engine counts the others). */
  hits = 0

  /** The index of engine `id`, or null when it has none (l1 off, or a runtime without external buffers). */
  static of(id) {
    const buffer = freshIndex(id)
    return buffer === null ? null : new FreshIndex(id, buffer)
  }

  constructor(id, buffer) {
    this.#id = id
    this.#words = new Uint32Array(buffer)
    this.#until = new Float64Array(buffer, 0, FRESH_UNTIL + 1)
    this.#epoch = this.epoch()
  }

  /** Read before the native call whose hit is offered (see offer). */
  epoch() {
    return Atomics.load(this.#words, FRESH_EPOCH)
  }

  /**
   * The slot of `key`'s value if it is indexed and still needs no decision, else -1. The epoch
   * is a plain load: Atomics.load is a builtin call here (non-shared buffer), and the Date.now()
   * runtime call after it keeps the JIT from reusing a load from an earlier read.
   *
   * Date.now() on every read, because expiry is exact as users see it (fresh iff Date.now() <
   * freshUntil). It is about a third of an indexed hit, yet no exact clock is materially cheaper
   * here (bench/clocks.js): performance.now(), anchored or not, costs 1.1-1.5x as much, and
   * process.hrtime.bigint() 0.9-1.1x with a BigInt per read. The coarse wall clock plus twice its
   * resolution, read through a raw native call at 0.5-0.7x, was tried and dropped: on this VM
   * (which has steal time) it was behind Date.now() in 0.13 % of reads, by up to 13 ms.
   * A cached reading, as lru-cache keeps until a timer clears it, is cheap only because it
   * stops: through synchronous work, or a loop of awaits that never yields to timers, it would
   * serve an expired entry fresh.
   */
  find(key) {
    const slot = this.#slots.get(key)
    if (slot === undefined || this.#words[FRESH_EPOCH] !== this.#epoch || Date.now() >= this.#untils[slot]) return -1
    return slot
  }

  /**
   * As find, for one of many keys a call reads at `now` (its Date.now() as it began: every
   * answer was fresh then, and not invalidated before it is read).
   */
  findAt(key, now) {
    const slot = this.#slots.get(key)
    if (slot === undefined || this.#words[FRESH_EPOCH] !== this.#epoch || now >= this.#untils[slot]) return -1
    return slot
  }

  /**
   * findAt for each of `keys` (`slots[i]`: key i's slot, or -1), and `out[i]` its value from
   * `held` (by slot; undefined for a key not found): what a getMany call reads first, in one loop
   * whose fields are read once. The positions not found, in order, or null if every key was.
   */
  findMany(keys, now, slots, out, held) {
    const map = this.#slots
    const words = this.#words
    const epoch = this.#epoch
    const untils = this.#untils
    let rest = null
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i]
      const slot = typeof key === 'string' ? map.get(key) : undefined
      if (slot === undefined || words[FRESH_EPOCH] !== epoch || now >= untils[slot]) {
        slots[i] = -1
        out[i] = undefined
        ;(rest ??= []).push(i)
      } else {
        slots[i] = slot
        out[i] = held[slot]
      }
    }
    return rest
  }

  /** served for each of the first `n` of `slots` that is not -1 (see findMany). */
  servedMany(slots, n) {
    for (let i = 0; i < n; i++) {
      const slot = slots[i]
      if (slot >= 0) this.served(slot)
    }
  }

  /** A hit at `slot` (from find) was served: counted, and logged for the LRU. */
  served(slot) {
    this.hits++
    const words = this.#words
    if (this.#marks[slot] === words[FRESH_TOUCH_GEN]) return
    let n = words[FRESH_TOUCH_LEN]
    if (n === FRESH_TOUCH_CAP) {
      applyTouches(this.#id)
      n = 0
    }
    this.#marks[slot] = words[FRESH_TOUCH_GEN]
    words[FRESH_TOUCHES + n] = slot
    words[FRESH_TOUCH_LEN] = n + 1
  }

  /**
   * The native peek answered a fresh hit at `slot` for `key`; `epoch` was read before it. If the
   * engine offered it, index it until then.
   */
  offer(key, slot, epoch) {
    const until = this.#until[FRESH_UNTIL]
    if (!(until > Date.now())) return
    if (epoch !== this.#epoch) {
      // Everything here may be wrong at another epoch.
      this.#slots.clear()
      this.#epoch = epoch
    }
    this.#slots.set(key, slot)
    this.#untils[slot] = until
  }

  /** Forgets everything (close). */
  clear() {
    this.#slots.clear()
  }
}

module.exports = { FreshIndex }
