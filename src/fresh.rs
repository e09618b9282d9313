//! The words an embedder's index of fresh entries shares with the engine.
//!
//! Crossing into native code costs a fresh hit more than the lookup (in Node, ~3x a `Map.get`:
//! the call, and copying the key out of the JS string to hash it again). So the embedder may
//! keep its own index of entries the engine has declared servable without a decision until a
//! time, and answer a hit there without calling in. These words make that safe:
//!
//! - `epoch` changes whenever anything the index holds could have become wrong: an entry
//!   removed, replaced, evicted or cleared (the store bumps it), an invalidation heard from
//!   another process (the inbox bumps it as the message *arrives*, on whatever thread, so a read
//!   after the arrival is never answered by the index), a tag deleted or a clear heard. An index
//!   filled at one epoch is void at any other; the embedder empties it and asks the engine again.
//! - `until`: written by a hit the engine proved fresh, the time (epoch ms, whole, exclusive)
//!   before which that entry needs no decision: no expiry and no XFetch draw can come earlier.
//!   0 after any other hit.
//! - the touch log: slots the embedder served, so the LRU still sees them. The store applies
//!   the log (on the embedder's thread) before it chooses what to evict, and when the embedder
//!   says it is full; each application advances `touch_gen`, so the embedder logs each slot at
//!   most once between two.
//!
//! The layout is `repr(C)` and fixed (the `*_WORD` constants): the embedder reads and writes it
//! as 32-bit words (and `until` as the second 64-bit float).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Slots the touch log holds before the embedder must have it applied.
pub const TOUCH_CAP: usize = 1024;

/// Word (u32) indexes of the fields, and the f64 index of `until`.
pub const EPOCH_WORD: usize = 0;
pub const TOUCH_GEN_WORD: usize = 1;
pub const UNTIL_F64: usize = 1;
pub const TOUCH_LEN_WORD: usize = 4;
pub const TOUCHES_WORD: usize = 5;

/// `touch_gen` stays below 2^30 so the embedder can keep it as a small integer.
const GEN_MASK: u32 = (1 << 30) - 1;

#[repr(C)]
#[derive(Debug)]
pub struct FreshWords {
    epoch: AtomicU32,
    touch_gen: AtomicU32,
    /// An f64's bits.
    until: AtomicU64,
    touch_len: AtomicU32,
    touches: [AtomicU32; TOUCH_CAP],
}

const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(FreshWords, epoch) == EPOCH_WORD * 4);
    assert!(offset_of!(FreshWords, touch_gen) == TOUCH_GEN_WORD * 4);
    assert!(offset_of!(FreshWords, until) == UNTIL_F64 * 8);
    assert!(offset_of!(FreshWords, touch_len) == TOUCH_LEN_WORD * 4);
    assert!(offset_of!(FreshWords, touches) == TOUCHES_WORD * 4);
};

impl Default for FreshWords {
    fn default() -> Self {
        FreshWords {
            epoch: AtomicU32::new(0),
            touch_gen: AtomicU32::new(0),
            until: AtomicU64::new(0),
            touch_len: AtomicU32::new(0),
            touches: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

impl FreshWords {
    /// Voids every index filled before (any thread).
    #[inline]
    pub fn bump(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// What the hit being answered may be served from an index until (0: not at all).
    #[inline]
    pub fn offer(&self, until: f64) {
        self.until.store(until.to_bits(), Ordering::Relaxed);
    }

    pub fn until(&self) -> f64 {
        f64::from_bits(self.until.load(Ordering::Relaxed))
    }

    /// Hands each logged slot to `f`, in the order served, and empties the log. On the
    /// embedder's thread, the only one that writes the log.
    pub fn drain_touches(&self, mut f: impl FnMut(u32)) {
        let n = (self.touch_len.load(Ordering::Relaxed) as usize).min(TOUCH_CAP);
        if n > 0 {
            for t in &self.touches[..n] {
                f(t.load(Ordering::Relaxed));
            }
            self.touch_len.store(0, Ordering::Relaxed);
        }
        let gen = self.touch_gen.load(Ordering::Relaxed);
        self.touch_gen
            .store((gen + 1) & GEN_MASK, Ordering::Relaxed);
    }

    /// Logs a served slot as the embedder does (for tests of the store); false when full.
    #[cfg(test)]
    pub fn log_touch(&self, slot: u32) -> bool {
        let n = self.touch_len.load(Ordering::Relaxed) as usize;
        if n == TOUCH_CAP {
            return false;
        }
        self.touches[n].store(slot, Ordering::Relaxed);
        self.touch_len.store(n as u32 + 1, Ordering::Relaxed);
        true
    }

    /// The words' size in bytes, for the embedder's view of them.
    pub const fn byte_len() -> usize {
        std::mem::size_of::<FreshWords>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draining_returns_the_log_in_order_and_advances_the_generation() {
        let w = FreshWords::default();
        assert!(w.log_touch(7) && w.log_touch(3));
        let mut seen = Vec::new();
        w.drain_touches(|s| seen.push(s));
        assert_eq!(seen, vec![7, 3]);
        assert_eq!(w.touch_gen.load(Ordering::Relaxed), 1);
        w.drain_touches(|_| panic!("the log was emptied"));
        for i in 0..TOUCH_CAP as u32 {
            assert!(w.log_touch(i));
        }
        assert!(!w.log_touch(0), "a full log takes no more");
    }

    #[test]
    fn the_generation_stays_a_small_integer() {
        let w = FreshWords::default();
        w.touch_gen.store(GEN_MASK, Ordering::Relaxed);
        w.drain_touches(|_| {});
        assert_eq!(w.touch_gen.load(Ordering::Relaxed), 0);
    }
}
