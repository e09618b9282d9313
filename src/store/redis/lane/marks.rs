//! When a read lane writes an alignment mark (an `ECHO` of a sequence number) after a batch of
//! reads: the rule, in pure Rust that tests reach without Node, and the record of the keys this
//! process wrote that it reads (`Written`, one per tier, shared by its lanes).
//!
//! Replies are matched to reads by order only; a mark's echo, found exactly where it must be,
//! proves that no reply was added or lost before it. Marks are amortised: a batch goes without
//! one when nothing is due, and its replies are delivered as they come; the next mark proves
//! them after the fact. A mark is due when:
//! - the batch reads a key this process wrote (its write's reply arrived, or it was sent) since
//!   the lane's last mark: so the first read of a key after this process wrote it is proven
//!   before it is delivered (read-your-writes);
//! - an invalidation was heard, or a clear made or heard, since the last mark (`changes`);
//! - more than `UNMARKED_READS` reads went unmarked, or `UNMARKED_MS` passed since the last mark.
//!
//! Why reads of other keys may go unmarked after a write here: a reply delivered to the wrong
//! read names its key (the envelope's key mark), and another key's is refused, so a shift can
//! only hand a read of key B an older reply of B, of a read sent after the last mark. B was not
//! written here since that mark (or this read would be marked), and not changed elsewhere (an
//! invalidation heard forces a mark), so that older reply holds what a proven read would have.
//! A shift is caught by the next mark at the latest, and a lane found out of step after it
//! delivered unproven replies drops every in-process copy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Reads a lane writes without a mark after them, at most: a shift is caught within this many
/// reads.
pub const UNMARKED_READS: u64 = 16;
/// And for at most this long since the last mark.
pub const UNMARKED_MS: u64 = 50;

/// Buckets of the keys written: keys that hash alike share one, and a write of one makes a read
/// of the other marked too (one `ECHO` more, never one less). 8 KB per tier.
const WRITTEN_BUCKETS: usize = 1024;

/// The keys this process wrote, by bucket: per bucket, the number of the newest write of a key
/// in it (writes are numbered from 1 in the order they are recorded). A lane remembers the
/// count when it last marked (`count`); a key was written since iff its bucket's number is
/// above that. Bounded whatever is written; written from any thread, read on the lane's.
#[derive(Debug)]
pub struct Written {
    /// The writes recorded so far.
    count: AtomicU64,
    /// Per bucket, the number of the newest write recorded of a key in it (0: none).
    buckets: Box<[AtomicU64]>,
}

impl Default for Written {
    fn default() -> Self {
        Written {
            count: AtomicU64::new(0),
            buckets: (0..WRITTEN_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Written {
    /// Records a write of `key` by this process: call it before the write is sent and again
    /// once Redis answered it (before its caller is told), so a read asked after the write
    /// resolved finds it recorded however the lane's marks fell meanwhile.
    pub fn record(&self, key: &str) {
        let n = self.count.fetch_add(1, Ordering::AcqRel) + 1;
        self.buckets[bucket(key)].fetch_max(n, Ordering::AcqRel);
    }

    /// The writes recorded so far (a lane keeps it when it marks).
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Whether `key` (or a key sharing its bucket) was written after the first `count` writes.
    pub fn since(&self, key: &str, count: u64) -> bool {
        self.buckets[bucket(key)].load(Ordering::Acquire) > count
    }
}

/// FNV-1a: cheap for the short keys a cache reads; its spread only decides how often a write
/// marks a read of another key.
fn bucket(key: &str) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % WRITTEN_BUCKETS as u64) as usize
}

/// A lane's side of the rule: what it saw when it last wrote a mark.
#[derive(Debug)]
pub struct MarkRule {
    /// Reads written when a mark was last decided on.
    decided: u64,
    /// The tier's `lane_changes` and `Written::count` when a mark was last written.
    changes_at_mark: u64,
    writes_at_mark: u64,
    /// When the last mark was written.
    written_at: Instant,
    /// Reads written unmarked since the last mark.
    unmarked: u64,
}

/// What the tier says now, for a decision (`MarkRule::decide`).
pub struct Seen<'a> {
    /// The tier's `lane_changes`.
    pub changes: u64,
    pub written: &'a Written,
    pub now: Instant,
}

impl MarkRule {
    /// A lane just opened: its first reads are marked.
    pub fn new(now: Instant) -> MarkRule {
        MarkRule {
            decided: 0,
            changes_at_mark: u64::MAX,
            writes_at_mark: 0,
            written_at: now,
            unmarked: 0,
        }
    }

    /// How many reads were written since the last decision, of `reads_written`.
    pub fn undecided(&self, reads_written: u64) -> usize {
        usize::try_from(reads_written - self.decided).unwrap_or(usize::MAX)
    }

    /// Whether a mark goes after the reads written since the last decision (`reads_written`
    /// counted since the lane opened; `keys`: those reads' keys, newest first, at least theirs).
    /// `None`: no read since; `Some(true)`: write a mark (the rule then counts from it).
    pub fn decide<'k>(
        &mut self,
        reads_written: u64,
        mut keys: impl Iterator<Item = &'k str>,
        seen: &Seen<'_>,
    ) -> Option<bool> {
        if reads_written == self.decided {
            return None;
        }
        let new = reads_written - self.decided;
        self.decided = reads_written;
        // Loaded before the buckets: a write recorded after it counts for the next mark.
        let writes = seen.written.count();
        let due = seen.changes != self.changes_at_mark
            || self.unmarked + new > UNMARKED_READS
            || seen.now.saturating_duration_since(self.written_at)
                >= Duration::from_millis(UNMARKED_MS)
            || (writes != self.writes_at_mark
                && keys.any(|k| seen.written.since(k, self.writes_at_mark)));
        if !due {
            self.unmarked += new;
            return Some(false);
        }
        self.changes_at_mark = seen.changes;
        self.writes_at_mark = writes;
        self.written_at = seen.now;
        self.unmarked = 0;
        Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(written: &Written, changes: u64, now: Instant) -> Seen<'_> {
        Seen {
            changes,
            written,
            now,
        }
    }

    #[test]
    fn the_first_reads_are_marked_then_reads_go_unmarked_while_nothing_changes() {
        let w = Written::default();
        let t = Instant::now();
        let mut rule = MarkRule::new(t);
        assert_eq!(rule.decide(0, ["a"].into_iter(), &seen(&w, 0, t)), None);
        assert_eq!(
            rule.decide(1, ["a"].into_iter(), &seen(&w, 0, t)),
            Some(true)
        );
        assert_eq!(
            rule.decide(1, ["a"].into_iter(), &seen(&w, 0, t)),
            None,
            "no new read"
        );
        for n in 2..=17 {
            assert_eq!(
                rule.decide(n, ["a"].into_iter(), &seen(&w, 0, t)),
                Some(false),
                "{n}"
            );
        }
        assert_eq!(
            rule.decide(18, ["a"].into_iter(), &seen(&w, 0, t)),
            Some(true),
            "17th"
        );
        assert_eq!(
            rule.decide(19, ["a"].into_iter(), &seen(&w, 0, t)),
            Some(false)
        );
        let later = t + Duration::from_millis(UNMARKED_MS);
        assert_eq!(
            rule.decide(20, ["a"].into_iter(), &seen(&w, 0, later)),
            Some(true),
            "50 ms on"
        );
    }

    #[test]
    fn a_write_here_marks_the_first_reads_of_its_key_only() {
        let w = Written::default();
        let t = Instant::now();
        let mut rule = MarkRule::new(t);
        assert_eq!(
            rule.decide(1, ["a"].into_iter(), &seen(&w, 0, t)),
            Some(true)
        );
        w.record("b");
        assert_eq!(
            rule.decide(2, ["a"].into_iter(), &seen(&w, 0, t)),
            Some(false),
            "another key"
        );
        assert_eq!(
            rule.decide(3, ["c"].into_iter(), &seen(&w, 0, t)),
            Some(false),
            "another key"
        );
        assert_eq!(
            rule.decide(4, ["b"].into_iter(), &seen(&w, 0, t)),
            Some(true),
            "the key written"
        );
        assert_eq!(
            rule.decide(5, ["b"].into_iter(), &seen(&w, 0, t)),
            Some(false),
            "proven once"
        );
        // In a batch of reads (or one MGET), any key written marks the batch.
        w.record("d");
        let batch = ["x", "d", "y"].into_iter();
        assert_eq!(rule.decide(8, batch, &seen(&w, 0, t)), Some(true));
    }

    #[test]
    fn a_write_recorded_between_two_decisions_counts_for_each_lane_by_its_own_last_mark() {
        let w = Written::default();
        let t = Instant::now();
        let (mut one, mut two) = (MarkRule::new(t), MarkRule::new(t));
        assert_eq!(
            one.decide(1, ["a"].into_iter(), &seen(&w, 0, t)),
            Some(true)
        );
        w.record("k");
        assert_eq!(
            two.decide(1, ["a"].into_iter(), &seen(&w, 0, t)),
            Some(true)
        );
        // `two` marked after the write: its reads of k are proven by that mark already.
        assert_eq!(
            two.decide(2, ["k"].into_iter(), &seen(&w, 0, t)),
            Some(false)
        );
        assert_eq!(
            one.decide(2, ["k"].into_iter(), &seen(&w, 0, t)),
            Some(true)
        );
        // Recorded again when Redis answered: the next read of k on either lane is marked.
        w.record("k");
        assert_eq!(
            two.decide(3, ["k"].into_iter(), &seen(&w, 0, t)),
            Some(true)
        );
        assert_eq!(
            one.decide(3, ["k"].into_iter(), &seen(&w, 0, t)),
            Some(true)
        );
    }

    #[test]
    fn anything_heard_marks_the_next_reads_of_every_key() {
        let w = Written::default();
        let t = Instant::now();
        let mut rule = MarkRule::new(t);
        assert_eq!(
            rule.decide(1, ["a"].into_iter(), &seen(&w, 7, t)),
            Some(true)
        );
        assert_eq!(
            rule.decide(2, ["a"].into_iter(), &seen(&w, 7, t)),
            Some(false)
        );
        assert_eq!(
            rule.decide(3, ["a"].into_iter(), &seen(&w, 8, t)),
            Some(true)
        );
        assert_eq!(
            rule.decide(4, ["a"].into_iter(), &seen(&w, 8, t)),
            Some(false)
        );
    }

    #[test]
    fn the_record_of_writes_stays_bounded_and_finds_every_key_written() {
        let w = Written::default();
        let before = w.count();
        for i in 0..10_000 {
            w.record(&format!("key{i}"));
        }
        assert_eq!(w.buckets.len(), WRITTEN_BUCKETS);
        assert!((0..10_000).all(|i| w.since(&format!("key{i}"), before)));
        let after = w.count();
        assert!((0..10_000).all(|i| !w.since(&format!("key{i}"), after)));
        // Keys spread over the buckets: a write marks few reads of other keys.
        let used = w
            .buckets
            .iter()
            .filter(|b| b.load(Ordering::Relaxed) > 0)
            .count();
        assert!(used > WRITTEN_BUCKETS * 9 / 10, "{used} buckets used");
    }
}
