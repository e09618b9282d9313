//! What other threads tell the cache: keys to drop from the in-process tier (Redis bus
//! invalidations) and whether stale in-process copies may still be trusted. Written from any
//! thread; applied by the cache on its own thread at its next call, so the hot path pays one
//! relaxed atomic load while nothing is pending.
//!
//! It also holds what `deleteByTag` and `clear` need, which costs nothing per tagged key:
//! - the *namespace clock*: a counter that every `deleteByTag` and `clear` advances (in Redis,
//!   `HINCRBY <ns>:meta clock`; without Redis, here). An entry is *born* at the clock its load
//!   began at (or its set was made at).
//! - per bucket of tag names, the clock of the newest `deleteByTag` heard of one of them, and
//!   the clock of the newest `clear`. An entry born before either is dead: a hit on a tagged
//!   entry checks its tags' buckets (a few atomic loads; untagged entries check nothing), and a
//!   load that began before the invalidation is born too early to be kept. Buckets are shared
//!   by tags that hash alike, so a `deleteByTag` may also drop a few entries of an unrelated tag
//!   (a reload, never a stale value).
//! - per bucket of tag names, the clock of the newest `expireByTag` heard of one of them: an
//!   entry born before it is *stale* (kept and served while one refresh runs), not dead; its
//!   refresh is born at or after that clock, so it is fresh again. A shared bucket may make an
//!   unrelated entry stale too (one early refresh, never a stale value served as fresh).

use crate::sync::LockOrRecover;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::fresh::FreshWords;

/// Buckets of invalidation stamps: a key's bucket changes whenever the key (or another key
/// hashing to the same bucket) is invalidated. A collision only costs a read not being cached.
const STAMP_BUCKETS: usize = 1024;

/// Buckets of tag clocks: 32 KB per cache; two tags share a bucket with probability 1/4096.
pub const TAG_BUCKETS: usize = 4096;

/// Distinct keys the inbox holds at most. An idle process (no calls, so nothing applied) that
/// hears a flood of announcements would otherwise grow without bound; past this, dropping the
/// whole in-process tier costs less than remembering every key.
pub const MAX_PENDING_KEYS: usize = 10_000;

/// What a Redis read saw of the invalidations of its key when it was sent; `adopt` compares it
/// with the current one, so a read answered before an invalidation but delivered after it is
/// not cached over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp(pub u64);

impl Stamp {
    /// Matches no key's stamp ever (stamps use 52 bits): a read handed it is never kept.
    pub const OUTDATED: Stamp = Stamp(u64::MAX);
}

#[derive(Debug)]
pub struct Inbox {
    /// Set whenever `keys` or `clear_all` has something; checked on every read.
    pending: AtomicBool,
    /// Keys another process replaced or deleted, each once, at most MAX_PENDING_KEYS.
    keys: Mutex<HashSet<Box<str>>>,
    /// Drop everything (the bus reconnected and what it missed cannot be told).
    clear_all: AtomicBool,
    /// Check every in-process copy against Redis (the bus reconnected: see `verify_all`).
    verify: AtomicBool,
    /// False while invalidations may be missed (bus down, Redis up): stale in-process copies
    /// are then re-checked against Redis instead of served.
    trust_stale: AtomicBool,
    /// Per bucket of keys, the sequence number of its last invalidation.
    stamps: Box<[AtomicU64]>,
    /// Counts key invalidations and writes here (`touch`): the stamps' sequence.
    sequence: AtomicU64,
    /// Counts key invalidations heard (not writes here).
    invalidations: AtomicU64,
    /// Counts clear-alls (they change every key's stamp).
    epoch: AtomicU64,
    /// The newest namespace clock known here (never ahead of Redis's).
    clock: AtomicU64,
    /// Per bucket of tag names, the clock of the newest deleteByTag heard for one of them.
    tag_clocks: Box<[AtomicU64]>,
    /// Per bucket of tag names, the clock of the newest expireByTag heard for one of them.
    tag_stale: Box<[AtomicU64]>,
    /// Per bucket, the time (epoch ms, f64 bits) after which what its expireByTags made stale is
    /// dead (an expireByTag given a window); infinity: each entry's own expiry.
    tag_stale_until: Box<[AtomicU64]>,
    /// Serializes the writers of `tag_stale` and `tag_stale_until` (a bucket's pair changes
    /// together; readers load them without it).
    stale_marks: Mutex<()>,
    /// The clock of the newest clear heard.
    cleared: AtomicU64,
    /// Shared with the embedder's index of fresh entries: whatever is heard here voids it at
    /// once, on the thread that hears it (see `fresh.rs`).
    fresh: Arc<FreshWords>,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            pending: AtomicBool::new(false),
            keys: Mutex::new(HashSet::new()),
            clear_all: AtomicBool::new(false),
            verify: AtomicBool::new(false),
            trust_stale: AtomicBool::new(true),
            stamps: (0..STAMP_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            sequence: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            clock: AtomicU64::new(0),
            tag_clocks: (0..TAG_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            tag_stale: (0..TAG_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            tag_stale_until: (0..TAG_BUCKETS)
                .map(|_| AtomicU64::new(f64::INFINITY.to_bits()))
                .collect(),
            stale_marks: Mutex::new(()),
            cleared: AtomicU64::new(0),
            fresh: Arc::default(),
        }
    }
}

/// A `deleteByTag`, `expireByTag` or `clear` applied here before Redis took it: the clock it was
/// marked at (one past the clock known here), and what each mark replaced, to put back if Redis
/// cannot take it (while Redis is unreachable, entries stay usable rather than all dead here).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tentative {
    pub clock: u64,
    /// `(bucket, its clock before)`.
    pub tags: Vec<(u16, u64)>,
    /// The marks in `tags` are expireByTag's (stale), not deleteByTag's (dead).
    pub stale: bool,
    /// For stale marks, each bucket's window end before (f64 bits), in the order of `tags`.
    pub untils: Vec<u64>,
    /// The clear clock before (a clear).
    pub cleared: Option<u64>,
}

/// What clears and tags since an entry's birth make of it (see [`Inbox::judge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Neither: as its own times say.
    Live,
    /// Tag-expired: stale from now on, whatever its freshUntil says.
    Stale,
    /// Cleared, tag-deleted, or tag-expired with a window that is over.
    Dead,
}

/// 20 bits of epoch over 32 of sequence: enough to tell "changed" from "unchanged", and under
/// 2^53, so the stamp survives a trip through a JS number.
fn compose(epoch: u64, seq: u64) -> Stamp {
    Stamp((epoch & 0xF_FFFF) << 32 | (seq & 0xFFFF_FFFF))
}

/// What the cache must apply.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    pub clear_all: bool,
    /// Hand every in-process copy to the check against Redis (see `Inbox::verify_all`).
    pub verify: bool,
    pub keys: Vec<Box<str>>,
}

impl Inbox {
    pub fn invalidate(&self, key: &str) {
        self.invalidate_stamped(key);
    }

    /// Invalidates the key like `invalidate`, returning the stamp this invalidation gave it: a
    /// value that came with the invalidation stays usable while the key's stamp is still this
    /// (a write here, or anything heard of the key, after it changes it). Made from the epoch read
    /// before the stamp moved, so a concurrent clear can only make it look outdated, never current.
    pub fn invalidate_stamped(&self, key: &str) -> Stamp {
        let epoch = self.epoch.load(Ordering::Acquire);
        let seq = self.sequence.fetch_add(1, Ordering::AcqRel) + 1;
        self.stamps[bucket(key)].store(seq, Ordering::Release);
        self.invalidations.fetch_add(1, Ordering::AcqRel);
        let mut keys = self.keys.lock_or_recover();
        if !keys.contains(key) {
            if keys.len() >= MAX_PENDING_KEYS {
                // Too many to remember: drop everything instead (stamps stay per key).
                keys.clear();
                keys.shrink_to(0);
                self.clear_all.store(true, Ordering::Relaxed);
            } else {
                keys.insert(key.into());
            }
        }
        drop(keys);
        self.pending.store(true, Ordering::Release);
        self.fresh.bump();
        compose(epoch, seq)
    }

    /// Changes the key's stamp without queueing anything: a write in this process, so a Redis
    /// read sent before it is not kept over it when it answers after.
    pub fn touch(&self, key: &str) {
        let seq = self.sequence.fetch_add(1, Ordering::AcqRel) + 1;
        self.stamps[bucket(key)].store(seq, Ordering::Release);
    }

    pub fn invalidate_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.clear_all.store(true, Ordering::Relaxed);
        self.pending.store(true, Ordering::Release);
        self.fresh.bump();
    }

    /// The bus subscribed again after a gap: the in-process copies are checked against Redis
    /// (the embedder hands them over at its next call), and those another instance changed
    /// meanwhile are dropped. Until then none is proved fresh without the engine.
    pub fn verify_all(&self) {
        self.verify.store(true, Ordering::Relaxed);
        self.pending.store(true, Ordering::Release);
        self.fresh.bump();
    }

    /// Changes every key's stamp without queueing anything (a clear in this process).
    pub fn touch_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Moves whenever something is heard (an invalidation, a clear) or a clear is made here; not
    /// for a write here (`touch`), which a read lane marks by its key instead: a lane that saw
    /// it still proves nothing changed elsewhere since.
    pub fn heard(&self) -> u64 {
        self.invalidations
            .load(Ordering::Acquire)
            .wrapping_add(self.epoch.load(Ordering::Acquire))
    }

    /// The key's invalidation stamp now; take it before sending a Redis read of the key.
    pub fn stamp(&self, key: &str) -> Stamp {
        let epoch = self.epoch.load(Ordering::Acquire);
        let seq = self.stamps[bucket(key)].load(Ordering::Acquire);
        compose(epoch, seq)
    }

    /// The words shared with the embedder's index of fresh entries.
    pub fn fresh(&self) -> &Arc<FreshWords> {
        &self.fresh
    }

    #[inline]
    pub fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// Takes everything pending.
    pub fn take(&self) -> Delivery {
        self.pending.store(false, Ordering::Relaxed);
        // Acquire pairs with the writers' Release: their pushes are visible below.
        std::sync::atomic::fence(Ordering::Acquire);
        let keys = std::mem::take(&mut *self.keys.lock_or_recover());
        let clear_all = self.clear_all.swap(false, Ordering::Relaxed);
        let verify = self.verify.swap(false, Ordering::Relaxed);
        Delivery {
            clear_all,
            verify,
            keys: keys.into_iter().collect(),
        }
    }

    /// Keys waiting to be applied (for tests: bounded whatever is heard).
    pub fn pending_keys(&self) -> usize {
        self.keys.lock_or_recover().len()
    }

    pub fn set_trust_stale(&self, trust: bool) {
        self.trust_stale.store(trust, Ordering::Relaxed);
    }

    #[inline]
    pub fn trusts_stale(&self) -> bool {
        self.trust_stale.load(Ordering::Relaxed)
    }

    /// The namespace clock an entry written now is born at.
    pub fn clock(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }

    /// A clock value learned from Redis (a reply or the bus): the clock only moves forward.
    pub fn observe_clock(&self, c: u64) {
        self.clock.fetch_max(c, Ordering::AcqRel);
    }

    /// Advances the clock here and returns the new value (a cache without Redis owns its clock).
    pub fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// A deleteByTag of a tag in `bucket` at clock `c`: entries of the bucket born before `c` die.
    pub fn invalidate_tag(&self, bucket: u16, c: u64) {
        if self.tag_clocks[bucket as usize].fetch_max(c, Ordering::AcqRel) < c {
            self.fresh.bump();
        }
    }

    #[inline]
    pub fn tag_clock(&self, bucket: u16) -> u64 {
        self.tag_clocks[bucket as usize].load(Ordering::Acquire)
    }

    /// An expireByTag of a tag in `bucket` at clock `c`, heard at `now`: entries of the bucket
    /// born before `c` turn stale, and dead after `until` (epoch ms; infinity: at their own
    /// expiry). A bucket keeps one window: the earliest of those not yet over (an entry dies
    /// early at worst: a reload, never a stale value served too long); one that is over is
    /// folded into the deleteByTag clock first, so what it made stale stays dead.
    pub fn stale_tag(&self, bucket: u16, c: u64, until: f64, now: f64) {
        let b = bucket as usize;
        let _writer = self.stale_marks.lock_or_recover();
        let old = self.tag_stale[b].load(Ordering::Acquire);
        let old_until = f64::from_bits(self.tag_stale_until[b].load(Ordering::Acquire));
        let mut until = until;
        if old > 0 {
            if old_until <= now {
                self.invalidate_tag(bucket, old);
            } else {
                until = until.min(old_until);
            }
        }
        if until != old_until {
            self.tag_stale_until[b].store(until.to_bits(), Ordering::Release);
        }
        if self.tag_stale[b].fetch_max(c, Ordering::AcqRel) < c || until != old_until {
            self.fresh.bump();
        }
    }

    #[inline]
    pub fn tag_stale_clock(&self, bucket: u16) -> u64 {
        self.tag_stale[bucket as usize].load(Ordering::Acquire)
    }

    /// The end of the bucket's stale window (epoch ms; infinity: none).
    #[inline]
    pub fn tag_stale_until(&self, bucket: u16) -> f64 {
        f64::from_bits(self.tag_stale_until[bucket as usize].load(Ordering::Acquire))
    }

    /// Whether an entry born at `born` with tags in `buckets` was tag-expired since (it is then
    /// stale, whatever its freshUntil says).
    #[inline]
    pub fn expired(&self, born: u64, buckets: &[u16]) -> bool {
        buckets.iter().any(|b| self.tag_stale_clock(*b) > born)
    }

    /// Whether an entry born at `born` with tags in `buckets` is dead at `now`: cleared or
    /// tag-deleted since it was born, or tag-expired with a window that is over.
    #[inline]
    pub fn gone(&self, born: u64, buckets: &[u16], now: f64) -> bool {
        self.judge(born, buckets, now) == Verdict::Dead
    }

    /// What clears and tags since `born` make of an entry with tags in `buckets` at `now`, in one
    /// pass over its buckets (a tagged hit's whole cost).
    #[inline]
    pub fn judge(&self, born: u64, buckets: &[u16], now: f64) -> Verdict {
        if self.cleared() > born {
            return Verdict::Dead;
        }
        let mut verdict = Verdict::Live;
        for b in buckets {
            if self.tag_clock(*b) > born {
                return Verdict::Dead;
            }
            if self.tag_stale_clock(*b) > born {
                if self.tag_stale_until(*b) <= now {
                    return Verdict::Dead;
                }
                verdict = Verdict::Stale;
            }
        }
        verdict
    }

    /// A clear at clock `c`: every entry born before `c` is dead.
    pub fn clear_at(&self, c: u64) {
        if self.cleared.fetch_max(c, Ordering::AcqRel) < c {
            self.fresh.bump();
        }
    }

    pub fn cleared(&self) -> u64 {
        self.cleared.load(Ordering::Acquire)
    }

    /// Puts back what `t` marked, where nothing newer replaced it since.
    pub fn revert(&self, t: &Tentative) {
        let marks = if t.stale {
            &self.tag_stale
        } else {
            &self.tag_clocks
        };
        let _writer = t.stale.then(|| self.stale_marks.lock_or_recover());
        for (i, (b, before)) in t.tags.iter().enumerate() {
            let put_back = marks[*b as usize]
                .compare_exchange(t.clock, *before, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            if let (true, Some(until)) = (put_back && t.stale, t.untils.get(i)) {
                self.tag_stale_until[*b as usize].store(*until, Ordering::Release);
            }
        }
        if let Some(before) = t.cleared {
            let _ =
                self.cleared
                    .compare_exchange(t.clock, before, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// Whether an entry born at `born` with tags in `buckets` was cleared or tag-deleted since.
    #[inline]
    pub fn dead(&self, born: u64, buckets: &[u16]) -> bool {
        self.cleared() > born || buckets.iter().any(|b| self.tag_clock(*b) > born)
    }
}

/// The bucket of the tag clocks a tag name falls in (a fixed hash: the same in every cache).
pub fn tag_bucket(tag: &str) -> u16 {
    let mut h = DefaultHasher::new();
    tag.hash(&mut h);
    (h.finish() % TAG_BUCKETS as u64) as u16
}

fn bucket(key: &str) -> usize {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    (h.finish() as usize) % STAMP_BUCKETS
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn deliveries_from_other_threads_arrive_once() {
        let inbox = Arc::new(Inbox::default());
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let inbox = inbox.clone();
                std::thread::spawn(move || {
                    for i in 0..250 {
                        inbox.invalidate(&format!("{t}:{i}"));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        assert!(inbox.has_pending());
        let d = inbox.take();
        assert_eq!(d.keys.len(), 1_000);
        assert!(!d.clear_all);
        assert!(!inbox.has_pending());
        assert_eq!(inbox.take(), Delivery::default());
        inbox.invalidate_all();
        assert!(inbox.take().clear_all);
    }

    /// The index of fresh entries is voided when a message arrives, on the thread that hears it,
    /// not when the cache later applies it; a tag clock or clear clock that does not move
    /// changes nothing.
    #[test]
    fn whatever_is_heard_voids_the_fresh_index_as_it_arrives() {
        let inbox = Arc::new(Inbox::default());
        let before = inbox.fresh().epoch();
        let heard = inbox.clone();
        std::thread::spawn(move || heard.invalidate("k"))
            .join()
            .unwrap();
        assert_ne!(
            inbox.fresh().epoch(),
            before,
            "voided before anything is applied"
        );
        assert!(inbox.has_pending());
        let mut last = inbox.fresh().epoch();
        let heard: [fn(&Inbox); 3] = [
            |i| i.invalidate_all(),
            |i| i.invalidate_tag(5, 3),
            |i| i.clear_at(2),
        ];
        for hear in heard {
            hear(&inbox);
            assert_ne!(inbox.fresh().epoch(), last);
            last = inbox.fresh().epoch();
        }
        inbox.invalidate_tag(5, 2);
        inbox.clear_at(1);
        inbox.touch("k");
        assert_eq!(
            inbox.fresh().epoch(),
            last,
            "nothing moved: the index stands"
        );
    }

    #[test]
    fn repeated_keys_are_held_once_and_a_flood_becomes_a_clear_all() {
        let inbox = Inbox::default();
        for _ in 0..100_000 {
            inbox.invalidate("hot");
        }
        assert_eq!(inbox.pending_keys(), 1);
        let d = inbox.take();
        assert_eq!((d.keys.len(), d.clear_all), (1, false));
        for i in 0..MAX_PENDING_KEYS + 5 {
            inbox.invalidate(&format!("k{i}"));
        }
        assert!(inbox.pending_keys() <= MAX_PENDING_KEYS);
        let d = inbox.take();
        assert!(
            d.clear_all,
            "an overflow must drop everything, not lose invalidations"
        );
        assert_eq!(inbox.pending_keys(), 0);
    }

    #[test]
    fn tags_and_clears_kill_entries_born_before_them_only() {
        let inbox = Inbox::default();
        let (a, b) = (tag_bucket("a"), tag_bucket("b"));
        assert_ne!(a, b, "these two names hash apart");
        let born = inbox.clock();
        assert!(!inbox.dead(born, &[a, b]));
        let c = inbox.tick();
        inbox.invalidate_tag(a, c);
        assert!(
            inbox.dead(born, &[a]),
            "born before the deleteByTag of its tag"
        );
        assert!(inbox.dead(born, &[b, a]));
        assert!(!inbox.dead(born, &[b]), "another tag");
        assert!(
            !inbox.dead(born, &[]),
            "untagged entries live through a deleteByTag"
        );
        assert!(!inbox.dead(inbox.clock(), &[a]), "born at or after it");
        // Clock values heard from elsewhere only move it forward.
        inbox.observe_clock(10);
        inbox.observe_clock(3);
        assert_eq!(inbox.clock(), 10);
        inbox.invalidate_tag(a, 2);
        assert_eq!(inbox.tag_clock(a), c.max(2));
        inbox.clear_at(7);
        assert!(inbox.dead(6, &[]) && !inbox.dead(7, &[]));
    }

    #[test]
    fn a_bucket_keeps_the_earliest_stale_window_not_over_and_folds_one_that_is() {
        let inbox = Inbox::default();
        let b = tag_bucket("t");
        assert_eq!(inbox.judge(0, &[b], 0.0), Verdict::Live);
        inbox.stale_tag(b, 2, 1_000.0, 0.0);
        assert_eq!(inbox.judge(1, &[b], 500.0), Verdict::Stale);
        assert_eq!(inbox.judge(2, &[b], 500.0), Verdict::Live, "born at it");
        // A later mark with a later window (or none) keeps the earlier one while it runs.
        inbox.stale_tag(b, 3, f64::INFINITY, 500.0);
        assert_eq!(inbox.tag_stale_until(b), 1_000.0);
        assert_eq!(
            inbox.judge(1, &[b], 1_000.0),
            Verdict::Dead,
            "the window is over"
        );
        assert_eq!(inbox.judge(2, &[b], 999.0), Verdict::Stale);
        // Once over, a new mark turns the old one into a death and starts its own window.
        inbox.stale_tag(b, 4, 5_000.0, 2_000.0);
        assert_eq!(
            inbox.tag_clock(b),
            3,
            "what the old window made stale stays dead"
        );
        assert_eq!(inbox.tag_stale_until(b), 5_000.0);
        assert_eq!(inbox.judge(3, &[b], 2_000.0), Verdict::Stale);
        assert_eq!(inbox.judge(2, &[b], 2_000.0), Verdict::Dead);
        // An older or repeated message changes nothing it should not.
        let epoch = inbox.fresh().epoch();
        inbox.stale_tag(b, 4, 5_000.0, 2_000.0);
        assert_eq!(inbox.fresh().epoch(), epoch);
        assert_eq!(inbox.judge(4, &[b], 2_000.0), Verdict::Live);
        inbox.clear_at(9);
        assert_eq!(inbox.judge(8, &[], 0.0), Verdict::Dead);
    }

    #[test]
    fn stamps_change_with_their_keys_invalidation_or_a_clear_all() {
        let inbox = Inbox::default();
        let a = inbox.stamp("a");
        assert_eq!(inbox.stamp("a"), a);
        inbox.invalidate("a");
        let a2 = inbox.stamp("a");
        assert_ne!(a2, a);
        inbox.invalidate_all();
        assert_ne!(inbox.stamp("a"), a2);
        // Taking deliveries does not change stamps: they describe history, not the queue.
        let a3 = inbox.stamp("a");
        inbox.take();
        assert_eq!(inbox.stamp("a"), a3);
    }

    #[test]
    fn an_invalidation_returns_the_stamp_it_gave_the_key() {
        let inbox = Inbox::default();
        let given = inbox.invalidate_stamped("a");
        assert_eq!(inbox.stamp("a"), given);
        inbox.touch("a");
        assert_ne!(inbox.stamp("a"), given, "a write here since");
        let given = inbox.invalidate_stamped("a");
        inbox.touch_all();
        assert_ne!(inbox.stamp("a"), given, "a clear here since");
    }
}
