//! The in-process operations: lookups, the ends of a flight without Redis, `set`, `delete`,
//! `get`, `inspect`, stats and the test counters.

use std::result::Result;

use napi_derive::napi;

use super::codes::{
    encode_hit, MISS, NO_SLOT, STEP_JOIN, STEP_KINDS, STEP_LEAD, STEP_SERVE, WRITTEN_NOWHERE,
};
use super::engines::{engine, with_engine, EngineState};
use super::options::{loaded_of, policy_of, LoadResult};
use super::JsErr;
use crate::cache::{Extra, Step};
use crate::store::redis::Expected;

/// What to do, as one number `n * STEP_KINDS + kind`: `kind` `STEP_SERVE` the hit `n`,
/// `STEP_LEAD` flight `n`, or `STEP_JOIN` flight `n` (`n >= 0`, below 2^50). A number, not an
/// object: an object's property names are interned on every call.
#[napi]
pub fn lookup(id: u32, key: String, policy: Option<Vec<f64>>, force: bool) -> Result<f64, JsErr> {
    with_engine(id, |c| {
        let beta = policy_of(c, policy.as_deref()).beta;
        let (kind, n) = match c.cache.lookup(&key, beta, force)? {
            Step::Serve(hit) => (STEP_SERVE, encode_hit(hit) as f64),
            Step::Lead(f) => (STEP_LEAD, f as f64),
            Step::Join(f) => (STEP_JOIN, f as f64),
        };
        Ok(n * STEP_KINDS as f64 + kind as f64)
    })
}

/// Registers the background refresh a hit asked for: its flight id, or -1 if one already runs.
/// `seen`: the fresh-until of the copy the caller was served from Redis (-1: it was served
/// from the in-process tier), the copy the refresh replaces.
#[napi]
pub fn begin_refresh(id: u32, key: String, seen: f64) -> f64 {
    with_engine(id, |c| {
        let seen = (seen >= 0.0).then_some(seen);
        Ok(c.cache.begin_refresh(&key, seen).map_or(-1.0, |f| f as f64))
    })
    .unwrap_or(-1.0)
}

/// The loader of `flight` returned (a cache without Redis; with Redis, `write_back` then
/// `finish_write`): the slot to keep the value at, `NO_SLOT` when the in-process tier keeps
/// nothing, `WRITTEN_NOWHERE` when the flight was superseded. `inherit` (a refresh): a result
/// given no tags keeps the replaced entry's.
#[napi]
pub fn complete(id: u32, key: String, flight: f64, loaded: LoadResult, inherit: bool) -> i32 {
    with_engine(id, |e| {
        let loaded = loaded_of(e, loaded, inherit);
        Ok(match e.cache.complete(&key, flight as u64, loaded) {
            None => WRITTEN_NOWHERE,
            Some(w) => w.slot.map_or(NO_SLOT, |s| s as i32),
        })
    })
    .unwrap_or(WRITTEN_NOWHERE)
}

/// The loader of `flight` is about to run.
#[napi]
pub fn note_loader_call(id: u32, key: String, flight: f64) {
    let _ = with_engine(id, |e| {
        e.cache.note_loader_call(&key, flight as u64);
        Ok(())
    });
}

/// The loader of `flight` declined caching (`ctx.skipCache()`): the flight ends, nothing is
/// written anywhere.
#[napi]
pub fn skip(id: u32, key: String, flight: f64) {
    let _ = with_engine(id, |c| {
        c.cache.skip(&key, flight as u64);
        Ok(())
    });
}

/// The facade's touch log of fresh hits it served itself is full: apply it to the LRU.
#[napi]
pub fn apply_touches(id: u32) {
    if let Some(e) = engine(id) {
        e.borrow_mut().cache.apply_touches();
    }
}

/// Slots whose values the facade should drop (freed under `l1.maxBytes`); take them before
/// keeping a value at a slot just handed out.
#[napi]
pub fn take_released(id: u32) -> Vec<u32> {
    engine(id)
        .map(|e| e.borrow_mut().cache.take_released())
        .unwrap_or_default()
}

/// The loader of `flight` failed. For a background refresh, returns its retry-after (epoch
/// ms) to record in Redis; else 0.
#[napi]
pub fn fail(id: u32, key: String, flight: f64) -> f64 {
    with_engine(id, |c| Ok(c.cache.fail(&key, flight as u64).unwrap_or(0.0))).unwrap_or(0.0)
}

/// Writes a value given to `set`: its slot, `NO_SLOT` when the in-process tier keeps nothing,
/// `WRITTEN_NOWHERE` when a zero TTL caches nothing at all.
#[napi]
pub fn set_entry(
    id: u32,
    key: String,
    negative: bool,
    policy: Option<Vec<f64>>,
    tags: Option<Vec<String>>,
    size: f64,
) -> Result<i32, JsErr> {
    with_engine(id, |e| {
        let p = policy_of(e, policy.as_deref());
        let extra = Extra {
            tags: tags.unwrap_or_default(),
            size: size as u64,
        };
        let expected = expected_of(e, &key);
        let written = e.cache.set(&key, negative, &p, &extra)?;
        if let Some(expected) = expected {
            e.expected.insert(key.clone(), expected);
        }
        Ok(match written {
            // A zero TTL keeps nothing here; the facade deletes any older copy in Redis.
            None => WRITTEN_NOWHERE,
            Some(w) => {
                if e.redis.is_some() {
                    e.written.insert(key, (w.envelope, extra.tags));
                }
                w.slot.map_or(NO_SLOT, |s| s as i32)
            }
        })
    })
}

/// With Redis, what the entry held for `key` says of it there, taken before a `set` or
/// `delete` replaces it (kept for the `redis_write` that sends the change).
fn expected_of(e: &mut EngineState, key: &str) -> Option<Expected> {
    let value_key = e.redis.as_ref()?.value_key(key);
    let held = e.cache.held_envelope(key);
    Some(Expected::of_held(held.as_ref(), &value_key))
}

/// `[freedSlot or NO_SLOT, 1 if a live entry was removed else 0]`.
#[napi]
pub fn delete_entry(id: u32, key: String) -> Result<Vec<i32>, JsErr> {
    with_engine(id, |c| {
        let expected = expected_of(c, &key);
        let (slot, removed) = c.cache.delete(&key)?;
        if let Some(expected) = expected {
            c.expected.insert(key, expected);
        }
        Ok(vec![slot.map_or(NO_SLOT, |s| s as i32), removed as i32])
    })
}

/// A fresh, stale or negative entry as `encode_hit` (never loads, never refreshes), or `MISS`.
/// With Redis, a miss here is counted by the Redis read that follows.
#[napi]
pub fn get_entry(id: u32, key: String) -> Result<i32, JsErr> {
    with_engine(id, |c| {
        let count_miss = c.redis.is_none();
        Ok(c.cache.get_hit(&key, count_miss)?.map_or(MISS, encode_hit))
    })
}

/// Starts or stops keeping the invalidations applied from other processes for
/// `take_invalidations` (the facade turns it on while its invalidation channel has listeners).
#[napi]
pub fn observe_invalidations(id: u32, on: bool) {
    if let Some(e) = engine(id) {
        e.borrow_mut().cache.observe_invalidations(on);
    }
}

/// The keys dropped because other processes changed them, in the order applied, since the last
/// call; `null` stands for everything (the bus reconnected, or too many to remember).
#[napi]
pub fn take_invalidations(id: u32) -> Vec<Option<String>> {
    engine(id)
        .map(|e| e.borrow_mut().cache.take_applied())
        .unwrap_or_default()
        .into_iter()
        .map(|k| k.map(String::from))
        .collect()
}

#[napi(object)]
pub struct EntryInfo {
    pub state: String,
    pub fresh_until: f64,
    pub hard_until: f64,
    pub compute_ms: f64,
}

#[napi]
pub fn inspect_entry(id: u32, key: String) -> Result<Option<EntryInfo>, JsErr> {
    with_engine(id, |c| {
        Ok(c.cache.inspect(&key)?.map(|i| EntryInfo {
            state: i.state.as_str().to_string(),
            fresh_until: i.fresh_until,
            hard_until: i.hard_until,
            compute_ms: i.compute_ms,
        }))
    })
}

#[napi(object)]
pub struct Stats {
    pub hits: f64,
    pub stale_hits: f64,
    pub misses: f64,
    pub loads: f64,
    pub coalesced: f64,
    pub refreshes: f64,
    pub refresh_errors: f64,
    pub negative_hits: f64,
    pub lock_wins: f64,
    pub lock_waits: f64,
    pub redis_errors: f64,
    pub l2_hits: f64,
    pub l1_entries: f64,
    pub l1_bytes: f64,
    pub replay_queued: f64,
    pub replay_dropped: f64,
}

/// Counters since construction (still readable after `close`).
#[napi]
pub fn stats(id: u32) -> Stats {
    let (s, (entries, bytes), queued) = engine(id)
        .map(|e| {
            let e = e.borrow();
            let queued = e.redis.as_ref().map_or(0, |t| t.replay_queued());
            (e.cache.stats.snapshot(), e.cache.l1_usage(), queued)
        })
        .unwrap_or_default();
    Stats {
        hits: s.hits as f64,
        stale_hits: s.stale_hits as f64,
        misses: s.misses as f64,
        loads: s.loads as f64,
        coalesced: s.coalesced as f64,
        refreshes: s.refreshes as f64,
        refresh_errors: s.refresh_errors as f64,
        negative_hits: s.negative_hits as f64,
        lock_wins: s.lock_wins as f64,
        lock_waits: s.lock_waits as f64,
        redis_errors: s.redis_errors as f64,
        l2_hits: s.l2_hits as f64,
        l1_entries: entries as f64,
        l1_bytes: bytes as f64,
        replay_queued: queued as f64,
        replay_dropped: s.replay_dropped as f64,
    }
}

/// Internal counts for tests: `[flights in progress, entries, lock-waiter keys, unsent writes
/// (with the flights' records, which hold their write-backs), inbox keys, applied invalidations
/// kept for the facade and not yet taken]`.
#[napi]
pub fn debug_counts(id: u32) -> Vec<u32> {
    engine(id)
        .map(|e| {
            let c = e.borrow();
            let waiting = c.redis.as_ref().map_or(0, |r| r.waiting_keys());
            let unsent = c.redis.as_ref().map_or(0, |r| r.pending_writes());
            vec![
                c.cache.flights_in_progress() as u32,
                c.cache.entries() as u32,
                waiting as u32,
                (c.written.len() + c.expected.len() + c.flights.len() + unsent) as u32,
                c.cache.inbox().pending_keys() as u32,
                c.cache.applied_kept() as u32,
                c.cache.refreshes_running() as u32,
            ]
        })
        .unwrap_or_else(|| vec![0; 7])
}

/// The slot of a live entry without counting a read (for `ctx.stale` on forceRefresh), or
/// `NO_SLOT`.
#[napi]
pub fn current_slot(id: u32, key: String) -> i32 {
    engine(id)
        .and_then(|e| e.borrow_mut().cache.live_slot(&key))
        .map_or(NO_SLOT, |s| s as i32)
}
