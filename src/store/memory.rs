//! The in-process tier: envelopes in LRU order, bounded by `maxEntries` and, if set, by
//! `maxBytes` (the serialized size of the values it keeps).
//!
//! The store keeps each entry's envelope and hands out a dense *slot* number; the embedder keeps
//! the value itself at that slot (in Node, a JS array), so a hit returns a small integer and the
//! value is never converted, copied or re-parsed. Slots are reused: an update keeps its key's
//! slot, an insert into a full store takes the evicted entry's slot, a removal frees its slot for
//! the next insert. Slot numbers therefore never exceed `max_entries`.
//!
//! With a byte budget, one insert may evict several entries whose slots nobody reuses at once;
//! those are listed as *released* so the embedder drops the values it keeps there (memory, not
//! just accounting, stays within the budget).
//!
//! The embedder may answer fresh hits from an index of its own (see `fresh.rs`): every change
//! that could make such an answer wrong (a replacement, an eviction, a removal, a clear) voids
//! that index, and the slots it served are promoted here (the touch log) before an insert
//! chooses what to evict, so a key read only through the index is not evicted as unused.

use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;

use crate::envelope::Envelope;
use crate::fresh::FreshWords;

pub type Slot = u32;

/// The tags an entry carries: their names (kept for a refresh that gives none, see
/// `Cache::prepare`) and their buckets in the inbox's tag clocks (what a hit checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tags {
    pub names: Box<[String]>,
    pub buckets: Box<[u16]>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub envelope: Envelope,
    pub slot: Slot,
    /// Neither negative nor tagged: the hot path proves such an entry fresh with one test and
    /// one time read, exactly as before tags existed.
    pub plain: bool,
    /// The value's serialized size in bytes.
    pub size: u64,
    pub tags: Option<Box<Tags>>,
}

/// An entry as the check against Redis after a lost bus connection needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub key: String,
    pub envelope: Envelope,
    pub tags: Vec<String>,
}

#[derive(Debug)]
pub struct MemoryStore {
    /// `None` when the tier is off (`l1: false`): nothing is kept.
    lru: Option<LruCache<Arc<str>, Entry>>,
    /// The key at each slot in use (the touch log names slots).
    keys: Vec<Option<Arc<str>>>,
    /// Shared with the embedder's index of fresh entries.
    fresh: Arc<FreshWords>,
    /// Slots freed by removals, reused before new ones are handed out.
    free: Vec<Slot>,
    /// The next never-used slot.
    next: Slot,
    /// `maxBytes`: the budget for the sum of `size` (`None`: count only).
    max_bytes: Option<u64>,
    /// The sum of `size` over the entries kept.
    bytes: u64,
    /// With a byte budget: slots freed since the embedder last took them (it drops the values it
    /// keeps there). Without one, every freed slot is reused by the next insert, as before.
    released: Vec<Slot>,
}

/// Entries an LRU makes room for up front; past it, its table grows as entries come.
const PREALLOCATED_ENTRIES: usize = 1 << 16;

/// An LRU of at most `cap` entries. `LruCache::new` allocates the table for `cap` at once: an
/// `l1.maxEntries` of 2^32-1 (the option's maximum) asked for ~100 GB and aborted the process.
fn lru_of(cap: NonZeroUsize) -> LruCache<Arc<str>, Entry> {
    if cap.get() <= PREALLOCATED_ENTRIES {
        return LruCache::new(cap);
    }
    let mut lru = LruCache::unbounded();
    lru.resize(cap);
    lru
}

impl MemoryStore {
    pub fn new(max_entries: Option<usize>, max_bytes: Option<u64>) -> Self {
        MemoryStore {
            lru: max_entries.and_then(NonZeroUsize::new).map(lru_of),
            keys: Vec::new(),
            fresh: Arc::default(),
            free: Vec::new(),
            next: 0,
            max_bytes,
            bytes: 0,
            released: Vec::new(),
        }
    }

    /// Shares `fresh` (the inbox's) as the words this store voids and reads the touch log from.
    pub fn sharing(mut self, fresh: Arc<FreshWords>) -> Self {
        self.fresh = fresh;
        self
    }

    /// Whether the embedder may index fresh entries: the tier keeps entries.
    pub fn indexes_fresh(&self) -> bool {
        self.lru.is_some()
    }

    /// Promotes the slots the embedder served from its index since the last call, in the order
    /// served; before anything is evicted, and when the embedder's log is full.
    pub fn apply_touches(&mut self) {
        let Some(lru) = self.lru.as_mut() else {
            return;
        };
        let keys = &self.keys;
        self.fresh.drain_touches(|slot| {
            if let Some(Some(k)) = keys.get(slot as usize) {
                lru.promote(&**k);
            }
        });
    }

    /// The slot's key is `key` (`None`: the slot is free).
    fn name_slot(&mut self, slot: Slot, key: Option<Arc<str>>) {
        let i = slot as usize;
        if i >= self.keys.len() {
            self.keys.resize(i + 1, None);
        }
        self.keys[i] = key;
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

    /// Writes the key's envelope and returns the slot its value goes to (`None`: tier off, or a
    /// value bigger than the whole byte budget, which is then not kept at all: an older copy of
    /// the key is removed rather than served).
    pub fn insert(
        &mut self,
        key: &str,
        envelope: Envelope,
        tags: Option<Box<Tags>>,
        size: u64,
    ) -> Option<Slot> {
        if self.max_bytes.is_some_and(|max| size > max) {
            self.remove(key);
            return None;
        }
        let plain = !envelope.negative && tags.is_none();
        self.apply_touches();
        let lru = self.lru.as_mut()?;
        let slot = if let Some(e) = lru.get_mut(key) {
            // An indexed copy of the old envelope would outlive it.
            self.fresh.bump();
            self.bytes = self.bytes - e.size + size;
            e.envelope = envelope;
            e.plain = plain;
            e.size = size;
            e.tags = tags;
            e.slot
        } else {
            let slot = if lru.len() == lru.cap().get() {
                // Full: the least recently used entry goes, and its slot serves the newcomer.
                lru.pop_lru().map(|(_, e)| {
                    self.fresh.bump();
                    self.bytes -= e.size;
                    e.slot
                })
            } else {
                None
            };
            let slot = slot.or_else(|| self.free.pop()).unwrap_or_else(|| {
                self.next += 1;
                self.next - 1
            });
            self.bytes += size;
            let name: Arc<str> = key.into();
            lru.put(
                name.clone(),
                Entry {
                    envelope,
                    slot,
                    plain,
                    size,
                    tags,
                },
            );
            self.name_slot(slot, Some(name));
            slot
        };
        self.enforce_budget();
        Some(slot)
    }

    /// Evicts least recently used entries until the byte budget holds. The entry just written
    /// is the most recent and fits on its own, so it is never the one evicted.
    fn enforce_budget(&mut self) {
        let (Some(max), Some(lru)) = (self.max_bytes, self.lru.as_mut()) else {
            return;
        };
        while self.bytes > max {
            let Some((_, e)) = lru.pop_lru() else { break };
            self.fresh.bump();
            self.bytes -= e.size;
            self.free.push(e.slot);
            self.released.push(e.slot);
            if let Some(k) = self.keys.get_mut(e.slot as usize) {
                *k = None;
            }
        }
    }

    /// Removes the key's entry; its slot is free for reuse and its value may be dropped.
    pub fn remove(&mut self, key: &str) -> Option<Entry> {
        let e = self.lru.as_mut()?.pop(key)?;
        self.fresh.bump();
        self.name_slot(e.slot, None);
        self.bytes -= e.size;
        self.free.push(e.slot);
        if self.max_bytes.is_some() {
            self.released.push(e.slot);
        }
        Some(e)
    }

    /// Every entry's key, envelope and tags (for the check after a lost bus connection).
    pub fn held(&self) -> Vec<Held> {
        let Some(lru) = self.lru.as_ref() else {
            return Vec::new();
        };
        lru.iter()
            .map(|(k, e)| Held {
                key: k.to_string(),
                envelope: e.envelope,
                tags: e.tags.as_ref().map_or_else(Vec::new, |t| t.names.to_vec()),
            })
            .collect()
    }

    /// Removes every entry `dead` says is dead; returns how many.
    pub fn remove_where(&mut self, dead: impl Fn(&Entry) -> bool) -> usize {
        let Some(lru) = self.lru.as_ref() else {
            return 0;
        };
        let keys: Vec<Arc<str>> = lru
            .iter()
            .filter(|(_, e)| dead(e))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &keys {
            self.remove(k);
        }
        keys.len()
    }

    /// Ends the freshness, at `now`, of every entry `stale` picks (an expireByTag applied here);
    /// values, slots and LRU order stay. Returns how many.
    pub fn stale_where(&mut self, now: f64, stale: impl Fn(&Entry) -> bool) -> usize {
        let Some(lru) = self.lru.as_mut() else {
            return 0;
        };
        let mut n = 0;
        for (_, e) in lru.iter_mut() {
            if e.envelope.fresh_until > now && stale(e) {
                e.envelope.fresh_until = now;
                n += 1;
            }
        }
        if n > 0 {
            self.fresh.bump();
        }
        n
    }

    /// Slots freed since the last call, whose values the embedder should drop. Take them before
    /// keeping a value at a slot an insert returned: the insert may have reused one of them.
    pub fn take_released(&mut self) -> Vec<Slot> {
        std::mem::take(&mut self.released)
    }

    pub fn clear(&mut self) {
        if let Some(lru) = self.lru.as_mut() {
            lru.clear();
        }
        self.fresh.bump();
        // Slots are handed out anew from 0: what the log names is gone.
        self.fresh.drain_touches(|_| {});
        self.keys.clear();
        self.free.clear();
        self.released.clear();
        self.next = 0;
        self.bytes = 0;
    }

    pub fn len(&self) -> usize {
        self.lru.as_ref().map_or(0, |l| l.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sum of the kept values' serialized sizes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(n: f64) -> Envelope {
        Envelope::new(n, 10.0, 100.0, 0.0, false)
    }

    fn put(s: &mut MemoryStore, key: &str, size: u64) -> Option<Slot> {
        s.insert(key, env(0.0), None, size)
    }

    #[test]
    fn evicts_least_recently_used_and_reuses_its_slot() {
        let mut s = MemoryStore::new(Some(2), None);
        let a = put(&mut s, "a", 1).unwrap();
        let b = put(&mut s, "b", 1).unwrap();
        assert_ne!(a, b);
        s.get("a"); // a is now most recently used; b goes next
        let c = put(&mut s, "c", 1).unwrap();
        assert_eq!(c, b);
        assert!(s.peek("b").is_none());
        assert!(s.peek("a").is_some());
        assert_eq!((s.len(), s.bytes()), (2, 2));
    }

    /// A capacity past what is allocated up front is still the bound (and allocates nothing
    /// for the maximum `l1.maxEntries`, 2^32-1).
    #[test]
    fn a_large_capacity_is_allocated_lazily_and_still_bounds() {
        let big = MemoryStore::new(Some(u32::MAX as usize), None);
        assert_eq!(big.len(), 0);
        let cap = PREALLOCATED_ENTRIES + 2;
        let mut s = MemoryStore::new(Some(cap), None);
        for i in 0..cap + 3 {
            put(&mut s, &format!("k{i}"), 1).unwrap();
        }
        assert_eq!(s.len(), cap);
        assert!(s.peek("k0").is_none() && s.peek(&format!("k{}", cap + 2)).is_some());
    }

    #[test]
    fn update_keeps_slot_and_removal_frees_it() {
        let mut s = MemoryStore::new(Some(10), None);
        let a = put(&mut s, "a", 5).unwrap();
        assert_eq!(s.insert("a", env(5.0), None, 7).unwrap(), a);
        assert_eq!(s.peek("a").unwrap().envelope.fresh_until, 15.0);
        assert_eq!(s.bytes(), 7);
        assert_eq!(s.remove("a").unwrap().slot, a);
        assert_eq!(s.bytes(), 0);
        assert!(s.remove("a").is_none());
        assert_eq!(put(&mut s, "z", 1).unwrap(), a);
        assert!(
            s.take_released().is_empty(),
            "no byte budget: nothing to release"
        );
    }

    #[test]
    fn slots_stay_below_capacity_under_churn() {
        let mut s = MemoryStore::new(Some(64), None);
        for i in 0..10_000u32 {
            let slot = put(&mut s, &format!("k{i}"), 10).unwrap();
            assert!(slot < 64);
            if i % 3 == 0 {
                s.remove(&format!("k{}", i / 2));
            }
        }
        assert!(s.len() <= 64);
        assert_eq!(s.bytes(), s.len() as u64 * 10);
    }

    #[test]
    fn disabled_tier_keeps_nothing() {
        let mut s = MemoryStore::new(None, None);
        assert_eq!(put(&mut s, "a", 1), None);
        assert!(s.get("a").is_none());
    }

    #[test]
    fn a_byte_budget_evicts_by_size_and_releases_the_slots() {
        let mut s = MemoryStore::new(Some(1_000), Some(30_000));
        for i in 0..3 {
            put(&mut s, &format!("k{i}"), 10_000).unwrap();
        }
        assert_eq!((s.len(), s.bytes()), (3, 30_000));
        s.get("k0"); // k1 is now the least recently used
        let big = put(&mut s, "big", 25_000).unwrap();
        // k1 and k2 went (k0 was used since), and so did k0: 25 KB + 10 KB > 30 KB.
        assert_eq!((s.len(), s.bytes()), (1, 25_000));
        let released = s.take_released();
        assert_eq!(released.len(), 3);
        assert!(!released.contains(&big), "the newcomer's slot is live");
        assert!(s.take_released().is_empty());
    }

    #[test]
    fn a_value_over_the_budget_is_not_kept_and_drops_the_older_copy() {
        let mut s = MemoryStore::new(Some(1_000), Some(10_000));
        let slot = put(&mut s, "k", 5_000).unwrap();
        assert_eq!(put(&mut s, "k", 10_001), None);
        assert!(s.peek("k").is_none(), "the older copy must not be served");
        assert_eq!((s.len(), s.bytes()), (0, 0));
        assert_eq!(s.take_released(), vec![slot]);
        // Exactly the budget fits.
        assert!(put(&mut s, "k", 10_000).is_some());
    }

    /// A key the embedder served from its index (logged, never `get` here) is not the one
    /// evicted: the log is applied before the insert chooses.
    #[test]
    fn slots_served_from_the_index_are_promoted_before_an_eviction() {
        let mut s = MemoryStore::new(Some(2), None);
        let a = put(&mut s, "a", 1).unwrap();
        put(&mut s, "b", 1);
        assert!(s.fresh.log_touch(a));
        put(&mut s, "c", 1);
        assert!(s.peek("a").is_some(), "the served key stays");
        assert!(s.peek("b").is_none(), "the unread one goes");
        // A logged slot whose key was removed since names nothing.
        let c = s.peek("c").unwrap().slot;
        assert!(s.fresh.log_touch(c));
        s.remove("c");
        put(&mut s, "d", 1);
        put(&mut s, "e", 1);
        assert!(s.peek("a").is_none() && s.peek("d").is_some() && s.peek("e").is_some());
    }

    /// Every change that could make an indexed answer wrong voids the index; a new key that
    /// evicts nothing, and a read, do not.
    #[test]
    fn changes_that_could_make_an_indexed_hit_wrong_void_the_index() {
        let mut s = MemoryStore::new(Some(2), Some(100));
        let epoch = |s: &MemoryStore| s.fresh.epoch();
        let mut last = epoch(&s);
        let mut changed = |s: &MemoryStore, what: &str, expect: bool| {
            assert_eq!(epoch(s) != last, expect, "{what}");
            last = epoch(s);
        };
        put(&mut s, "a", 1);
        changed(&s, "a new key", false);
        s.get("a");
        changed(&s, "a read", false);
        put(&mut s, "a", 2);
        changed(&s, "a replacement", true);
        put(&mut s, "b", 1);
        changed(&s, "a second key", false);
        put(&mut s, "c", 1);
        changed(&s, "an eviction by count", true);
        put(&mut s, "d", 99);
        changed(&s, "an eviction by size", true);
        s.remove("d");
        changed(&s, "a removal", true);
        s.remove("d");
        changed(&s, "removing nothing", false);
        s.clear();
        changed(&s, "a clear", true);
    }

    #[test]
    fn plain_marks_entries_that_are_neither_negative_nor_tagged() {
        let mut s = MemoryStore::new(Some(10), None);
        put(&mut s, "a", 1);
        assert!(s.peek("a").unwrap().plain);
        let tags = Tags {
            names: vec!["t".to_string()].into(),
            buckets: vec![3].into(),
        };
        s.insert("a", env(0.0), Some(Box::new(tags)), 1);
        assert!(!s.peek("a").unwrap().plain);
        s.insert("n", Envelope::new(0.0, 1.0, 1.0, 0.0, true), None, 1);
        assert!(!s.peek("n").unwrap().plain);
    }
}
