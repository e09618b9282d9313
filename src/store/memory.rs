//! The in-process tier: envelopes in LRU order, bounded by `maxEntries`.
//!
//! The store keeps each entry's envelope and hands out a dense *slot* number; the embedder keeps
//! the value itself at that slot (in Node, a JS array), so a hit returns a small integer and the
//! value is never converted, copied or re-parsed. Slots are reused: an update keeps its key's
//! slot, an insert into a full store takes the evicted entry's slot, a removal frees its slot for
//! the next insert. Slot numbers therefore never exceed `max_entries`.

use std::num::NonZeroUsize;

use lru::LruCache;

use crate::envelope::Envelope;

pub type Slot = u32;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry {
    pub envelope: Envelope,
    pub slot: Slot,
}

#[derive(Debug)]
pub struct MemoryStore {
    /// `None` when the tier is off (`l1: false`): nothing is kept.
    lru: Option<LruCache<Box<str>, Entry>>,
    /// Slots freed by removals, reused before new ones are handed out.
    free: Vec<Slot>,
    /// The next never-used slot.
    next: Slot,
}

impl MemoryStore {
    pub fn new(max_entries: Option<usize>) -> Self {
        MemoryStore {
            lru: max_entries.and_then(NonZeroUsize::new).map(LruCache::new),
            free: Vec::new(),
            next: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.lru.is_some()
    }

    /// The key's entry, marked most recently used.
    #[inline]
    pub fn get(&mut self, key: &str) -> Option<&mut Entry> {
        self.lru.as_mut()?.get_mut(key)
    }

    /// The key's entry, LRU order untouched.
    pub fn peek(&self, key: &str) -> Option<&Entry> {
        self.lru.as_ref()?.peek(key)
    }

    /// Writes the key's envelope and returns the slot its value goes to (`None`: tier off).
    pub fn insert(&mut self, key: &str, envelope: Envelope) -> Option<Slot> {
        let lru = self.lru.as_mut()?;
        if let Some(e) = lru.get_mut(key) {
            e.envelope = envelope;
            return Some(e.slot);
        }
        let slot = if lru.len() == lru.cap().get() {
            // Full: the least recently used entry goes, and its slot serves the newcomer.
            lru.pop_lru().map(|(_, e)| e.slot)
        } else {
            None
        };
        let slot = slot.or_else(|| self.free.pop()).unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        lru.put(key.into(), Entry { envelope, slot });
        Some(slot)
    }

    /// Removes the key's entry; its slot is free for reuse and its value may be dropped.
    pub fn remove(&mut self, key: &str) -> Option<Entry> {
        let e = self.lru.as_mut()?.pop(key)?;
        self.free.push(e.slot);
        Some(e)
    }

    pub fn clear(&mut self) {
        if let Some(lru) = self.lru.as_mut() {
            lru.clear();
        }
        self.free.clear();
        self.next = 0;
    }

    pub fn len(&self) -> usize {
        self.lru.as_ref().map_or(0, |l| l.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(n: f64) -> Envelope {
        Envelope::new(n, 10.0, 100.0, 0.0, false)
    }

    #[test]
    fn evicts_least_recently_used_and_reuses_its_slot() {
        let mut s = MemoryStore::new(Some(2));
        let a = s.insert("a", env(0.0)).unwrap();
        let b = s.insert("b", env(0.0)).unwrap();
        assert_ne!(a, b);
        s.get("a"); // a is now most recently used; b goes next
        let c = s.insert("c", env(0.0)).unwrap();
        assert_eq!(c, b);
        assert!(s.peek("b").is_none());
        assert!(s.peek("a").is_some());
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn update_keeps_slot_and_removal_frees_it() {
        let mut s = MemoryStore::new(Some(10));
        let a = s.insert("a", env(0.0)).unwrap();
        assert_eq!(s.insert("a", env(5.0)).unwrap(), a);
        assert_eq!(s.peek("a").unwrap().envelope.fresh_until, 15.0);
        assert_eq!(s.remove("a").unwrap().slot, a);
        assert!(s.remove("a").is_none());
        assert_eq!(s.insert("z", env(0.0)).unwrap(), a);
    }

    #[test]
    fn slots_stay_below_capacity_under_churn() {
        let mut s = MemoryStore::new(Some(64));
        for i in 0..10_000u32 {
            let slot = s.insert(&format!("k{i}"), env(0.0)).unwrap();
            assert!(slot < 64);
            if i % 3 == 0 {
                s.remove(&format!("k{}", i / 2));
            }
        }
        assert!(s.len() <= 64);
    }

    #[test]
    fn disabled_tier_keeps_nothing() {
        let mut s = MemoryStore::new(None);
        assert!(!s.enabled());
        assert_eq!(s.insert("a", env(0.0)), None);
        assert!(s.get("a").is_none());
    }
}
