//! Changes (`set`, `delete`, `expire`, `deleteByTag`, `expireByTag`, `clear`; a kind more is a variant of `Change` and an
//! arm of `apply`) that reach Redis even when it cannot take them at once. A change Redis
//! refuses (down, timed out, an error) is queued (`replay`) and replayed, in the order the
//! changes were made, once Redis answers again; a change made while others wait goes behind
//! them, so the order holds across the outage. A replayed `set` or `delete` carries the time it
//! was made and is dropped in Redis when the key holds a change made at or after that time
//! (`write.lua`): a replay never replaces a newer `set`, whichever instance made it. A replayed
//! `set` also carries what this instance knew of the key in Redis when it made it (`Expected`):
//! found changed in a way it did not see (a delete, a load, another write), it becomes an
//! invalidation, so no instance serves its value over a newer state. A replayed
//! `expire`, `deleteByTag`, `expireByTag` or `clear` applies to what Redis holds when it is
//! taken (a tag's is numbered then), so it may also reach entries written meanwhile (a refresh
//! or a reload, never an older value served).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::replay::{self, Queued, Replayed};
use super::{RedisTier, TagFailure, Unavailable};
use crate::envelope::{write_identity, Body, Envelope, Fmt, IDENTITY_BYTES};
use crate::inbox::Tentative;

/// How many times a change may be refused by a Redis that is up (an error reply, not an
/// outage) before it is dropped: a change Redis will never take must not hold up the rest.
const REFUSALS: u32 = 5;

/// What this instance knew of a key in Redis when it made a change of it: what a replay of a
/// `set` expects the key to hold (`write.lua`; anything else, it invalidates the key instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// The write it held in process (read from Redis or written there), by its identity.
    Known([u8; IDENTITY_BYTES]),
    /// Nothing: its own change of the key before this one, still waiting, was a delete.
    Absent,
    /// What a clear leaves: its own change before this one, still waiting, was a `clear` (none
    /// of the key since). The key holds nothing, or an entry born before the clear, dead (the
    /// sweep that removes those runs after the clear, alongside the changes behind it).
    Cleared,
    /// Nothing known: it held nothing (`l1: false`, never read, evicted). An absent key is then
    /// taken as expected: a delete elsewhere cannot be told from a key never written.
    Unknown,
}

impl Expected {
    /// What the in-process entry `held` at `value_key` (if any) says.
    pub fn of_held(held: Option<&Envelope>, value_key: &str) -> Self {
        held.map_or(Expected::Unknown, |e| {
            Expected::Known(write_identity(e, value_key))
        })
    }

    /// As `write.lua` takes it (ARGV[7]): `k` and the identity, `a`, `u`, or `c` and `cleared`,
    /// the clock of the newest clear known here (at least the one this change waited behind,
    /// which Redis took before it).
    pub(super) fn arg(&self, cleared: u64) -> Vec<u8> {
        match self {
            Expected::Known(id) => [&b"k"[..], id].concat(),
            Expected::Absent => b"a".to_vec(),
            Expected::Unknown => b"u".to_vec(),
            Expected::Cleared => format!("c{cleared}").into_bytes(),
        }
    }
}

/// A replayed `set` or `delete`: when it was made (it is dropped by a change of its key made at
/// or after that), and what a set expects of the key.
#[derive(Debug, Clone, Copy)]
pub struct Replaying {
    pub made_at: u64,
    pub expected: Expected,
}

/// A change of this cache's entries, as Redis is asked to take it.
#[derive(Debug, Clone)]
pub enum Change {
    /// `set` (an entry: its envelope and tags, and its value) or `delete` (none) of `key`, made
    /// at `at_ms` (epoch ms), when this instance knew `expected` of the key in Redis.
    Write {
        key: String,
        entry: Option<(Envelope, Vec<String>)>,
        value_json: Option<String>,
        fmt: Fmt,
        at_ms: u64,
        expected: Expected,
    },
    DeleteTags {
        tags: Vec<String>,
        at_ms: u64,
    },
    /// `expire(key)`, made at `at_ms`: the entry stale from `now` (epoch ms, as it was then).
    Expire {
        key: String,
        now: f64,
        at_ms: u64,
    },
    /// `expireByTag(tags)`: stale, and gone at `stale_until` (epoch ms; infinite: at each
    /// entry's own hardTtl) unless refreshed.
    ExpireTags {
        tags: Vec<String>,
        stale_until: f64,
        at_ms: u64,
    },
    /// `tentative`: what the clear marked here (put back if Redis cannot take it at once).
    Clear {
        tentative: Tentative,
        at_ms: u64,
    },
}

impl replay::Change for Change {
    fn key(&self) -> Option<&str> {
        match self {
            Change::Write { key, .. } | Change::Expire { key, .. } => Some(key),
            Change::DeleteTags { .. } | Change::ExpireTags { .. } | Change::Clear { .. } => None,
        }
    }

    fn every_key(&self) -> bool {
        matches!(self, Change::Clear { .. })
    }

    fn made_at(&self) -> u64 {
        match self {
            Change::Write { at_ms, .. }
            | Change::DeleteTags { at_ms, .. }
            | Change::Expire { at_ms, .. }
            | Change::ExpireTags { at_ms, .. }
            | Change::Clear { at_ms, .. } => *at_ms,
        }
    }
}

/// What Redis did with a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A set or delete; whether a value key existed before.
    Wrote {
        existed: bool,
    },
    /// A replayed set or delete older than what the key holds: not applied.
    Superseded,
    /// A replayed set that found its key changed in a way this instance did not see: the key
    /// was deleted instead (and announced), so every instance's next read loads it.
    Invalidated,
    /// An expire; whether the value key existed.
    Expired {
        existed: bool,
    },
    Tagged,
    /// A clear, at this clock (sweep the entries born before it).
    Cleared {
        clock: u64,
    },
}

/// What became of a change asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    Now(Applied),
    /// Redis holds it (it waited behind others).
    Later,
    /// Redis could not take it: queued for replay.
    Queued,
    /// The cache closed: neither taken nor queued.
    Closed,
}

impl RedisTier {
    /// Has Redis take `change` (run it through `in_order` or `in_order_global`): at once, or,
    /// while other changes wait, behind them; queued if Redis cannot take it.
    pub async fn take_change(&self, change: Change) -> Taken {
        if self.closed() {
            return Taken::Closed;
        }
        if !self.replay.is_empty() {
            let (tx, rx) = oneshot::channel();
            let change = self.behind_its_key(change);
            self.queue_change(Queued::new(change, Some(tx)));
            self.kick_replay();
            return match rx.await {
                Ok(Replayed::Taken) => Taken::Later,
                Ok(Replayed::Queued) => Taken::Queued,
                Err(_) => Taken::Closed,
            };
        }
        match self.apply(&change, false).await {
            Ok(applied) => Taken::Now(applied),
            Err(Unavailable) => {
                // What the clear marked here was put back; a replay marks nothing more.
                let change = match change {
                    Change::Clear { tentative, at_ms } => Change::Clear {
                        tentative: Tentative {
                            clock: tentative.clock,
                            ..Tentative::default()
                        },
                        at_ms,
                    },
                    other => other,
                };
                let change = self.behind_its_key(change);
                self.queue_change(Queued::new(change, None));
                Taken::Queued
            }
        }
    }

    /// `change` as it waits behind this instance's own waiting changes of its key: a set then
    /// expects what the newest of them leaves (a set's write, nothing after a delete, dead
    /// entries after a clear), not
    /// what was held here (which may be nothing: `l1: false`, or that delete).
    fn behind_its_key(&self, mut change: Change) -> Change {
        if let Change::Write { key, expected, .. } = &mut change {
            let leaves = self.replay.newest_of(key, |before| match before {
                Change::Write {
                    entry: Some((envelope, _)),
                    ..
                } => Some(Expected::of_held(Some(envelope), &self.value_key(key))),
                Change::Write { entry: None, .. } => Some(Expected::Absent),
                Change::Clear { .. } => Some(Expected::Cleared),
                // An expire redraws what it finds: what is held here says what it left.
                _ => None,
            });
            if let Some(leaves) = leaves.flatten() {
                *expected = leaves;
            }
        }
        change
    }

    /// The time a change made now is made at (epoch ms; `now_ms` the clock's): never the time of
    /// an earlier change of this instance, so that two changes of a key made in one millisecond
    /// replay as two (the second is newer than the first, not its equal).
    pub fn change_time(&self, now_ms: u64) -> u64 {
        let mut last = self.last_change_ms.load(Ordering::Relaxed);
        loop {
            let at = now_ms.max(last + 1);
            match self.last_change_ms.compare_exchange_weak(
                last,
                at,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return at,
                Err(seen) => last = seen,
            }
        }
    }

    /// Changes waiting for replay.
    pub fn replay_queued(&self) -> usize {
        self.replay.len()
    }

    fn queue_change(&self, q: Queued<Change>) {
        for dropped in self.replay.push(q) {
            self.drop_change(dropped, "more than 10,000 changes waited for Redis");
        }
    }

    fn drop_change(&self, mut q: Queued<Change>, why: &str) {
        self.stats.replay_dropped.incr();
        if let Some(waiter) = q.waiter.take() {
            let _ = waiter.send(Replayed::Queued);
        }
        let (what, key) = match &q.change {
            Change::Write { key, entry, .. } => {
                // Its effect here stays only until Redis is asked again.
                self.inbox.invalidate(key);
                (
                    if entry.is_some() { "set" } else { "delete" },
                    Some(key.as_str()),
                )
            }
            Change::Expire { key, .. } => {
                self.inbox.invalidate(key);
                ("expire", Some(key.as_str()))
            }
            Change::DeleteTags { .. } => ("deleteByTag", None),
            Change::ExpireTags { .. } => ("expireByTag", None),
            Change::Clear { .. } => ("clear", None),
        };
        self.reports.push_each(
            "replay",
            key,
            format!("a {what} Redis could not take was dropped without being replayed: {why}"),
        );
    }

    /// Starts the drain unless one runs or nothing waits (called after any Redis success).
    pub(super) fn kick_replay(&self) {
        if self.replay.is_empty() || self.closed() || !self.replay.begin_drain() {
            return;
        }
        match self.me.upgrade() {
            Some(me) => {
                self.runtime.spawn(me.drain_replay());
            }
            None => self.replay.end_drain(),
        }
    }

    /// Replays the waiting changes oldest first, until none waits or Redis refuses one (it
    /// stays in front; the next success starts the drain again).
    async fn drain_replay(self: Arc<Self>) {
        loop {
            if self.closed() {
                for q in self.replay.take_all() {
                    drop(q);
                }
                self.replay.end_drain();
                return;
            }
            let Some(mut q) = self.replay.pop() else {
                self.replay.end_drain();
                // A change queued between the last look and the end of the drain.
                self.kick_replay();
                return;
            };
            match self.apply(&q.change, true).await {
                Ok(applied) => {
                    if let Applied::Cleared { clock } = applied {
                        if let Some(me) = self.me.upgrade() {
                            self.runtime.spawn(async move {
                                let _ = me.sweep(clock).await;
                            });
                        }
                    }
                    if let Some(waiter) = q.waiter.take() {
                        let _ = waiter.send(Replayed::Taken);
                    }
                }
                Err(Unavailable) => {
                    if let Some(waiter) = q.waiter.take() {
                        let _ = waiter.send(Replayed::Queued);
                    }
                    if self.health.redis_up() {
                        q.refusals += 1;
                        if q.refusals >= REFUSALS {
                            self.drop_change(q, "Redis refused it every time it was replayed");
                            continue;
                        }
                    }
                    self.queue_change(q);
                    self.replay.end_drain();
                    // The changes behind it wait too: their callers are told now (after the
                    // drain ended: one queued while it ran found it running and started none).
                    self.replay.answer_waiters(Replayed::Queued);
                    return;
                }
            }
        }
    }

    /// Asks Redis to take `change` once. `replayed`: it was made before now (a set or delete
    /// is then dropped by a newer change of its key).
    async fn apply(&self, change: &Change, replayed: bool) -> Result<Applied, Unavailable> {
        match change {
            Change::Write {
                key,
                entry,
                value_json,
                fmt,
                at_ms,
                expected,
            } => {
                let body = entry.as_ref().map(|(_, tags)| Body {
                    value_json: value_json.as_deref(),
                    tags,
                    fmt: *fmt,
                });
                let written = entry.as_ref().zip(body.as_ref()).map(|((e, _), b)| (e, b));
                let replaying = replayed.then_some(Replaying {
                    made_at: *at_ms,
                    expected: *expected,
                });
                let applied = self.write(key, written, *at_ms, replaying).await?;
                if matches!(applied, Applied::Superseded | Applied::Invalidated) {
                    // Another instance's change holds the key (or, invalidated, nothing does):
                    // the copy here, of this older one, goes.
                    self.inbox.invalidate(key);
                }
                Ok(applied)
            }
            Change::Expire { key, now, .. } => {
                // Whatever the key holds when it is replayed turns stale (a set made after the
                // expire too: one refresh more, never an older value served).
                let existed = self.expire(key, *now).await?;
                Ok(Applied::Expired { existed })
            }
            Change::DeleteTags { tags, .. } => match self.mark_tags(tags, None).await {
                Ok(()) => Ok(Applied::Tagged),
                Err(TagFailure::NotTaken | TagFailure::Partial) => Err(Unavailable),
            },
            Change::ExpireTags {
                tags, stale_until, ..
            } => match self.mark_tags(tags, Some(*stale_until)).await {
                Ok(()) => Ok(Applied::Tagged),
                Err(TagFailure::NotTaken | TagFailure::Partial) => Err(Unavailable),
            },
            Change::Clear { tentative, .. } => {
                let clock = self.clear(tentative).await?;
                Ok(Applied::Cleared { clock })
            }
        }
    }
}
