//! The Redis operations of the binding. Each returns a promise; the tier works on napi's tokio
//! runtime. Writes (write-backs, `set`, `delete`, lock releases after failures) are queued in
//! call order per key here, synchronously on the JS thread, before anything is awaited.
//!
//! A flight's state from its gate to its end stays in its record (`flight.rs`): these calls
//! take the flight id and what only the facade has.

use std::cell::RefCell;
use std::rc::Rc;
use std::result::Result;
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi_derive::napi;
use tokio::sync::oneshot;

use super::answer::{Landed, RedisAnswer};
use super::codes::{
    DROPPED, NOT_SENT, NO_SLOT, PURPOSE_COLD, PURPOSE_FORCE, PURPOSE_PAST_VALUE, PURPOSE_REFRESH,
    QUEUED, UNAVAILABLE, WRITTEN, WRITTEN_NOWHERE,
};
use super::engines::{engine, with_engine, EngineState};
use super::flight::{Flight, Found, Gated};
use super::lane::{self, Asked, Lane, LaneAsk, LaneGet};
use super::options::{loaded_of, LoadResult};
use super::reads::{carried, carried_gate, fetch, gate, settle_lane_read, For, Gating};
use super::{napi_fail, settle, JsErr};
use crate::cache::Extra;
use crate::clock::{Clock, SystemClock};
use crate::envelope::{Body, Envelope, Fmt};
use crate::error::ErrorCode;
use crate::inbox::Stamp;
use crate::store::redis::{
    explained, Applied, Change, Expected, HeldLock, Outage, RedisTier, Taken, WriteBack,
};

/// The engine's read lane, if it can take a read now (`lane::ready`).
pub(super) fn lane_of(env: &Env, id: u32, tier: &Arc<RedisTier>) -> Option<Rc<RefCell<Lane>>> {
    let e = engine(id)?;
    let mut e = e.borrow_mut();
    lane::ready(env, &mut e.lane, tier)
}

/// The lane a read of `key` takes, if one can take it now: on a Cluster the lane to the node
/// serving it (`lane::ready_node`), else the engine's lane.
fn lane_for(env: &Env, id: u32, tier: &Arc<RedisTier>, key: &str) -> Option<Rc<RefCell<Lane>>> {
    if !tier.lane_is_cluster() {
        return lane_of(env, id, tier);
    }
    let e = engine(id)?;
    let mut e = e.borrow_mut();
    lane::ready_node(env, &mut e.node_lanes, tier, key)
}

/// Begins flight `to`'s record at its first gate (`purpose`: what it is for), and answers what
/// the gate needs: the tier and the refresh basis of a live cache, and the key's
/// invalidation stamp taken now (an invalidation after this may predate the read).
fn begin(to: For, key: &str, purpose: u32) -> (Option<Gating>, Option<Stamp>) {
    let Some(e) = engine(to.id) else {
        return (None, None);
    };
    let mut e = e.borrow_mut();
    let stamp = Some(e.cache.inbox().stamp(key));
    let tier = match &e.redis {
        Some(tier) if !e.cache.is_closed() => tier.clone(),
        _ => return (None, stamp),
    };
    e.flights
        .entry(to.flight)
        .or_insert_with(|| Flight::new(key.to_string(), purpose));
    // What a refresh gate compares Redis's copy with: the copy the refresh replaces (with
    // `l1: false` there is no in-process entry to ask).
    let local_fresh_until = e.cache.refresh_basis(key).unwrap_or(0.0);
    (Some((tier, local_fresh_until)), stamp)
}

/// Asks Redis before flight `flight` loads (`purpose`: a `PURPOSE_*` code; anything unknown is a
/// cold load): found / lead / skip / closed. A cold load takes the value an announcement
/// carried, answered at once (not a promise), or else reads on the read lane when it can.
#[napi(ts_return_type = "unknown[] | Promise<unknown[]>")]
pub fn redis_gate(
    env: &Env,
    id: u32,
    key: String,
    purpose: u32,
    flight: f64,
) -> napi::Result<Either<Landed, PromiseRaw<'_, Landed>>> {
    let to = For {
        id,
        flight: flight as u64,
    };
    let purpose = match purpose {
        PURPOSE_REFRESH | PURPOSE_FORCE | PURPOSE_PAST_VALUE => purpose,
        _ => PURPOSE_COLD,
    };
    let (gating, stamp) = begin(to, &key, purpose);
    if purpose == PURPOSE_COLD {
        if let Some(found) = carried_gate(to, &key) {
            return Ok(Either::A(found));
        }
    }
    if let (PURPOSE_COLD, Some((tier, _)), Some(stamp)) = (purpose, &gating, stamp) {
        if let Some(lane) = lane_for(env, id, tier, &key) {
            let ask = LaneAsk::Cold {
                id,
                flight: to.flight,
            };
            let get = LaneGet { key, stamp, ask };
            let asked = Asked::One {
                get,
                then: settle_lane_read,
            };
            return lane::send(env, &lane, tier, asked).map(Either::B);
        }
    }
    settle::spawn_settled(env, gate(to, gating, key, purpose, stamp, false)).map(Either::B)
}

/// Reads a key from Redis (for `get` and `inspect`): found / missing / unavailable. `count`
/// (for `get`): counted as an l2Hit or a miss, and takes the value an announcement carried,
/// answered at once (not a promise). Takes the read lane when it can.
#[napi(ts_return_type = "unknown[] | Promise<unknown[]>")]
pub fn redis_fetch(
    env: &Env,
    id: u32,
    key: String,
    count: bool,
) -> napi::Result<Either<RedisAnswer, PromiseRaw<'_, RedisAnswer>>> {
    if count {
        if let Some(found) = carried(id, &key, true) {
            return Ok(Either::A(found));
        }
    }
    // Here, on the JS thread, before a set or delete called after this read can touch it.
    let (tier, stamp) = match engine(id) {
        Some(e) => {
            let e = e.borrow();
            let tier = e.redis.clone().filter(|_| !e.cache.is_closed());
            (tier, Some(e.cache.inbox().stamp(&key)))
        }
        None => (None, None),
    };
    if let (Some(tier), Some(stamp)) = (&tier, stamp) {
        if let Some(lane) = lane_for(env, id, tier, &key) {
            let get = LaneGet {
                key,
                stamp,
                ask: LaneAsk::Fetch { count },
            };
            let asked = Asked::One {
                get,
                then: settle_lane_read,
            };
            return lane::send(env, &lane, tier, asked).map(Either::B);
        }
    }
    settle::spawn_settled(env, fetch(tier, key, stamp, count)).map(Either::B)
}

/// Takes `found` into the in-process tier for `key`, ending `flight` if any; see `adopt`.
pub(super) fn keep_found(
    e: &mut EngineState,
    key: &str,
    flight: Option<u64>,
    cold: bool,
    found: Found,
    beta: f64,
) -> i32 {
    // A write of the key by this instance is queued or unanswered: Redis may have run this
    // read before it (the read's stamp already includes the write's call). Served, not kept.
    let stamp = if e.redis.as_ref().is_some_and(|t| t.writing(key)) {
        Some(Stamp::OUTDATED)
    } else {
        found.stamp
    };
    // Decided whether or not the entry is kept here: the caller was served it either way.
    let beta = if beta >= 0.0 {
        beta
    } else {
        e.cache.options().defaults.beta
    };
    let refresh = cold && e.cache.served_refresh_due(&found.envelope, beta);
    let extra = Extra {
        tags: found.tags,
        size: found.size,
    };
    let slot = match e.cache.adopt(key, flight, found.envelope, extra, stamp) {
        None => WRITTEN_NOWHERE,
        Some(slot) => slot.map_or(NO_SLOT, |s| s as i32),
    };
    slot * 2 + i32::from(refresh)
}

/// Takes the envelope flight `flight`'s gate found into the in-process tier, ending the
/// flight. `cold`: the flight is a cold load, whose caller starts the refresh of a stale value
/// found, or of a fresh one an XFetch draw at `beta` (-1: the constructor's) picks (a refresh
/// found refreshed elsewhere starts none).
///
/// Answers `slot * 2 + refresh`: the slot for the value (`NO_SLOT` when the tier keeps nothing,
/// `WRITTEN_NOWHERE` when superseded, expired or dead; read it back with `>> 1`), and whether
/// the caller, served a stale value, should start its refresh (`& 1`). A number, not an object:
/// an object's property names are interned on every call.
#[napi]
pub fn adopt(id: u32, flight: f64, cold: bool, beta: f64) -> i32 {
    with_engine(id, |e| Ok(adopt_flight(e, flight as u64, cold, beta)))
        .unwrap_or(WRITTEN_NOWHERE * 2)
}

/// Ends `flight` with the entry its gate found (`adopt`, and `adoptMany` per key of a gate
/// batch): what `adopt` answers.
pub(super) fn adopt_flight(e: &mut EngineState, flight: u64, cold: bool, beta: f64) -> i32 {
    let Some(f) = e.flights.remove(&flight) else {
        // The cache closed since the gate answered.
        return WRITTEN_NOWHERE * 2;
    };
    let Gated::Found(found) = f.gated else {
        // Only a found answer is adopted; anything else ends the flight writing nothing.
        e.cache.finish_write(&f.key, flight, None, false, None);
        return WRITTEN_NOWHERE * 2;
    };
    keep_found(e, &f.key, Some(flight), cold, found, beta)
}

/// What the in-process tier keeps of a found answer of `redisFetch` or `redisFetchMany`, read
/// back from the answer object the facade was given (see `RedisAnswer`).
fn found_of(answer: &Object) -> napi::Result<Found> {
    let number = |name: &str| -> napi::Result<f64> { Ok(answer.get::<f64>(name)?.unwrap_or(-1.0)) };
    let envelope = Envelope {
        fresh_until: number("freshUntil")?,
        hard_until: number("hardUntil")?,
        compute_ms: number("computeMs")?,
        negative: answer.get::<bool>("negative")?.unwrap_or(false),
        retry_after: number("retryAfter")?,
        born: number("born")?.max(0.0) as u64,
    };
    let stamp = number("stamp")?;
    Ok(Found {
        envelope,
        // Null for none.
        tags: answer
            .get::<Option<Vec<String>>>("tags")?
            .flatten()
            .unwrap_or_default(),
        stamp: (stamp >= 0.0).then_some(Stamp(stamp as u64)),
        size: number("bytes")?.max(0.0) as u64,
    })
}

/// Takes the envelope a read (`get`, `getMany`: no flight) found into the in-process tier, as
/// `answer` (the read's found answer) carries it; answers as `adopt` does (never asking for a
/// refresh).
#[napi]
pub fn adopt_read(id: u32, key: String, answer: Object) -> Result<i32, JsErr> {
    // `l1: false` keeps nothing in process: the answer is not read back. Reading its nine
    // properties, each by a name V8 hashes and looks up anew, took a third of a lane read's CPU
    // (TLS, 64 in flight: 7.2-7.5 µs a read with it, 4.5-4.7 µs without).
    let keeps = with_engine(id, |e| Ok(e.cache.options().l1_max_entries.is_some()));
    if keeps.is_ok_and(|keeps| !keeps) {
        return Ok(WRITTEN_NOWHERE * 2);
    }
    let found = found_of(&answer).map_err(|e| napi_fail(ErrorCode::InvalidArgument, e))?;
    Ok(
        with_engine(id, |e| Ok(keep_found(e, &key, None, false, found, -1.0)))
            .unwrap_or(WRITTEN_NOWHERE * 2),
    )
}

/// Another process holds the refresh: end `flight` and hold local refreshes back meanwhile.
#[napi]
pub fn abandon(id: u32, flight: f64) {
    let flight = flight as u64;
    let _ = with_engine(id, |e| {
        let Some(f) = e.flights.remove(&flight) else {
            return Ok(());
        };
        // Until the holder announces its result, or at most a second, or its lock's life.
        let hold = e.cache.options().lock_ttl.min(1_000.0);
        e.cache.abandon(&f.key, flight, hold);
        Ok(())
    });
}

/// The loader of `flight` returned `loaded`, whose value is `value_json` (`fmt`: a `FMT_*`
/// code): prepares its entry (the flight stays registered, so callers keep joining it) and
/// writes it back to Redis with the flight's ticket (fenced by what the gate read, after this
/// instance's earlier writes of the key); always releases the lock the flight holds. Resolves
/// with what became of it (`WRITTEN`, `DROPPED`, `UNAVAILABLE`, `NOT_SENT`); then call
/// `finish_write`, whose `keep` is "not `DROPPED`".
#[napi]
pub fn write_back(
    env: &Env,
    id: u32,
    flight: f64,
    loaded: LoadResult,
    value_json: Option<String>,
    fmt: u32,
) -> napi::Result<PromiseRaw<'_, i32>> {
    let flight = flight as u64;
    let (tx, rx) = oneshot::channel();
    let queued = engine(id).and_then(|e| {
        let mut e = e.borrow_mut();
        let inherit = e.flights.get(&flight)?.inherits();
        let untagged = loaded.tags.as_ref().is_none_or(Option::is_none);
        let mut loaded = loaded_of(&e, loaded, inherit);
        let f = e.flights.get_mut(&flight)?;
        let (key, forced) = (f.key.clone(), f.forced());
        let (lock, fence, born) = match f.ticket() {
            Some(t) => {
                // A refresh given no tags keeps those Redis's copy had.
                if untagged && inherit && !t.tags.is_empty() {
                    loaded.extra.tags = std::mem::take(&mut t.tags);
                }
                (t.lock.take(), t.fence.take(), t.born)
            }
            None => (None, None, None),
        };
        let prepared = e.cache.prepare(&key, flight, loaded, born);
        if let Some(f) = e.flights.get_mut(&flight) {
            f.prepared = prepared.clone();
        }
        let tier = e.redis.clone()?;
        let job_tier = tier.clone();
        let job_key = key.clone();
        tier.in_order(&key, async move {
            let written = prepared.flatten();
            let body = written.as_ref().map(|p| Body {
                value_json: value_json.as_deref(),
                tags: &p.extra.tags,
                fmt: Fmt::from_code(fmt),
            });
            // The write-back releases the lock itself (after the write, in one script).
            let token = lock.map(HeldLock::take);
            let outcome = job_tier
                .write_back(
                    &job_key,
                    written
                        .as_ref()
                        .zip(body.as_ref())
                        .map(|(p, b)| (&p.envelope, b)),
                    token.as_deref(),
                    fence.as_ref(),
                    forced,
                )
                .await;
            let _ = tx.send(outcome);
        });
        Some(())
    });
    settle::spawn_settled(env, async move {
        if queued.is_none() {
            return Ok(NOT_SENT);
        }
        Ok(match rx.await {
            Ok(WriteBack::Written) => WRITTEN,
            Ok(WriteBack::Dropped) => DROPPED,
            Ok(WriteBack::Unavailable) => UNAVAILABLE,
            Ok(WriteBack::NotSent) | Err(_) => NOT_SENT,
        })
    })
}

/// Ends `flight` after its write-back: the slot its value goes to, `NO_SLOT` when the in-process
/// tier keeps nothing, `WRITTEN_NOWHERE` when it is kept nowhere (dropped, superseded,
/// invalidated since its gate took the key's stamp).
#[napi]
pub fn finish_write(id: u32, flight: f64, keep: bool) -> i32 {
    let flight = flight as u64;
    with_engine(id, |e| {
        let Some(mut f) = e.flights.remove(&flight) else {
            // The cache closed since the write-back.
            return Ok(WRITTEN_NOWHERE);
        };
        let stamp = f.ticket().and_then(|t| t.stamp);
        let Some(prepared) = f.prepared else {
            // Superseded before it was prepared: only the flight ends.
            e.cache.finish_write(&f.key, flight, None, false, None);
            return Ok(WRITTEN_NOWHERE);
        };
        let keep = keep && prepared.is_some();
        Ok(
            match e.cache.finish_write(&f.key, flight, prepared, keep, stamp) {
                Some(slot) => slot as i32,
                None if keep => NO_SLOT,
                None => WRITTEN_NOWHERE,
            },
        )
    })
    .unwrap_or(WRITTEN_NOWHERE)
}

/// Sends what `set_entry` just wrote (or, with `delete`, the key's removal) to Redis after this
/// instance's earlier writes of the key. Resolves 1 when a value key existed before, 0 when not,
/// `QUEUED` when Redis could not take the change (it is replayed later), `UNAVAILABLE` when it
/// was not sent (closed).
#[napi]
pub fn redis_write(
    env: &Env,
    id: u32,
    key: String,
    value_json: Option<String>,
    delete: bool,
    fmt: u32,
) -> napi::Result<PromiseRaw<'_, i32>> {
    let (tx, rx) = oneshot::channel();
    let queued = engine(id).and_then(|e| {
        let mut e = e.borrow_mut();
        let written = e.written.remove(&key);
        let expected = e.expected.remove(&key).unwrap_or(Expected::Unknown);
        let tier = e.redis.clone()?;
        if !delete && written.is_none() {
            return None;
        }
        let job_tier = tier.clone();
        // When the change was made: a replay of it never replaces a later one.
        let change = Change::Write {
            key: key.clone(),
            entry: if delete { None } else { written },
            value_json,
            fmt: Fmt::from_code(fmt),
            at_ms: tier.change_time(SystemClock.now_ms().max(0.0) as u64),
            expected,
        };
        tier.in_order(&key, async move {
            let _ = tx.send(job_tier.take_change(change).await);
        });
        Some(())
    });
    settle::spawn_settled(env, async move {
        if queued.is_none() {
            return Ok(UNAVAILABLE);
        }
        Ok(match rx.await {
            Ok(Taken::Now(Applied::Wrote { existed })) => existed as i32,
            Ok(Taken::Now(_) | Taken::Later) => 0,
            Ok(Taken::Queued) => QUEUED,
            Ok(Taken::Closed) | Err(_) => UNAVAILABLE,
        })
    })
}

/// The load of `flight` failed, timed out or skipped the cache (the engine's `fail` or `skip`
/// ended it): ends its record, releasing its lock (announcing it, so waiters take over at once);
/// a failed refresh first records `retry_after` in the Redis envelope. `null` when there is
/// nothing to send, else a promise that resolves once it is sent.
#[napi(ts_return_type = "Promise<void> | null")]
pub fn redis_failed(
    env: &Env,
    id: u32,
    flight: f64,
    retry_after: f64,
) -> napi::Result<Option<PromiseRaw<'_, ()>>> {
    let ended = engine(id).and_then(|e| {
        let mut e = e.borrow_mut();
        let mut f = e.flights.remove(&(flight as u64))?;
        let lock = f.ticket().and_then(|t| t.lock.take());
        if lock.is_none() && retry_after <= 0.0 {
            return None;
        }
        Some((e.redis.clone()?, f.key, lock))
    });
    let Some((tier, key, lock)) = ended else {
        return Ok(None);
    };
    let (tx, rx) = oneshot::channel::<()>();
    let job_tier = tier.clone();
    let job_key = key.clone();
    tier.in_order(&key, async move {
        let token = lock.map(HeldLock::take);
        job_tier
            .record_failure(&job_key, token.as_deref(), retry_after)
            .await;
        let _ = tx.send(());
    });
    settle::spawn_settled(env, async move {
        let _ = rx.await;
        Ok(())
    })
    .map(Some)
}

#[napi(object)]
pub struct RedisReport {
    pub op: String,
    pub key: Option<String>,
    pub message: String,
    /// `'down'`: the failure that began an outage; `'up'`: Redis answers again after one (not a
    /// failure: the facade never hands it to `onError`); absent for any other failure.
    pub outage: Option<String>,
}

/// Why Redis could not take the latest change it refused: the latest failure's message,
/// scrubbed as `take_redis_reports` scrubs them (null: none known).
#[napi]
pub fn last_redis_failure(id: u32) -> Option<String> {
    let (reports, config) = engine(id).and_then(|e| {
        let e = e.borrow();
        Some((e.reports.clone()?, e.cache.options().redis.clone()?))
    })?;
    let tls = config.tls.is_some() || config.tls_wanted();
    reports.latest().map(|m| explained(&config.scrub(&m), tls))
}

/// Redis failures waiting for `onError` (already rate-limited). Their messages are the redis
/// crate's and the TLS library's words, which quote no password today; `scrub` keeps it so
/// whatever a later version of them says.
#[napi]
pub fn take_redis_reports(id: u32) -> Vec<RedisReport> {
    let Some((reports, config)) = engine(id).and_then(|e| {
        let e = e.borrow();
        Some((e.reports.clone()?, e.cache.options().redis.clone()?))
    }) else {
        return Vec::new();
    };
    let tls = config.tls.is_some() || config.tls_wanted();
    reports
        .take()
        .into_iter()
        .map(|r| RedisReport {
            op: r.op.to_string(),
            key: r.key,
            message: explained(&config.scrub(&r.message), tls),
            outage: match r.outage {
                Outage::None => None,
                Outage::Began => Some("down".to_string()),
                Outage::Ended => Some("up".to_string()),
            },
        })
        .collect()
}

#[napi]
pub fn has_redis(id: u32) -> bool {
    engine(id).is_some_and(|e| e.borrow().redis.is_some())
}

/// `expire(key)`: applied here at once (the entry stale from now, its running load superseded),
/// then in Redis after this instance's earlier writes of the key. Resolves with bit 0 set when a
/// live entry was here and bit 1 when the value key existed in Redis, `QUEUED` when Redis could
/// not take it (the effect here is kept; it is replayed later), or `UNAVAILABLE` when it was not
/// sent (closed).
#[napi]
pub fn expire_entry(env: &Env, id: u32, key: String) -> Result<PromiseRaw<'_, i32>, JsErr> {
    let (tx, rx) = oneshot::channel();
    let (here, tier) = with_engine(id, |e| {
        let now = e.cache.now().floor();
        let here = e.cache.expire(&key, now)?;
        Ok((here, e.redis.clone().map(|tier| (tier, now))))
    })?;
    let queued = tier.map(|(tier, now)| {
        let job_tier = tier.clone();
        let job_key = key.clone();
        let at_ms = tier.change_time(SystemClock.now_ms().max(0.0) as u64);
        tier.in_order(&key, async move {
            let change = Change::Expire {
                key: job_key,
                now,
                at_ms,
            };
            let _ = tx.send(job_tier.take_change(change).await);
        });
    });
    settle::spawn_settled(env, async move {
        let here = here as i32;
        if queued.is_none() {
            return Ok(here);
        }
        Ok(match rx.await {
            Ok(Taken::Now(Applied::Expired { existed })) => here | (existed as i32) << 1,
            Ok(Taken::Now(_) | Taken::Later) => here,
            Ok(Taken::Queued) => QUEUED,
            Ok(Taken::Closed) | Err(_) => UNAVAILABLE,
        })
    })
    .map_err(|e| napi_fail(ErrorCode::Redis, e))
}

/// `expireByTag(tags)`: as `delete_tags`, marking the entries carrying them stale instead of
/// dead (served while one refresh runs). `within` (ms from now; absent: none) ends the window in
/// which they are served stale: past it, those not refreshed are dead.
#[napi]
pub fn expire_tags(
    env: &Env,
    id: u32,
    tags: Vec<String>,
    within: Option<f64>,
) -> Result<PromiseRaw<'_, i32>, JsErr> {
    let within = within.filter(|w| w.is_finite()).map(|w| w.max(0.0));
    mark_tags(env, id, tags, Some(within))
}

/// `deleteByTag(tags)`: applied here at once (every entry carrying one of them, and every load
/// that began before and will carry one, is dead), then in Redis after this instance's earlier
/// writes (later ones wait for it). Resolves 1 once Redis holds it, 0 without Redis, `QUEUED`
/// when Redis could not take it (the effect here is kept, see `Cache::revert_tags`; it is
/// replayed later), `UNAVAILABLE` when it was not sent (closed).
#[napi]
pub fn delete_tags(env: &Env, id: u32, tags: Vec<String>) -> Result<PromiseRaw<'_, i32>, JsErr> {
    mark_tags(env, id, tags, None)
}

/// `deleteByTag` (`stale: None`) or `expireByTag` (`stale: Some(window in ms, if any)`) here,
/// then in Redis.
fn mark_tags(
    env: &Env,
    id: u32,
    tags: Vec<String>,
    stale: Option<Option<f64>>,
) -> Result<PromiseRaw<'_, i32>, JsErr> {
    let (tx, rx) = oneshot::channel();
    let mut stale_until = None;
    let tier = with_engine(id, |e| {
        let owns_clock = e.redis.is_none();
        let tentative = match stale {
            Some(within) => {
                let until = within.map_or(f64::INFINITY, |w| (e.cache.now() + w).floor());
                stale_until = Some(until);
                e.cache.expire_tags(&tags, owns_clock, until)?
            }
            None => e.cache.delete_tags(&tags, owns_clock)?,
        };
        Ok(e.redis.clone().map(|tier| (tier, tentative)))
    })?;
    let (queued, tentative) = match tier {
        Some((tier, tentative)) => {
            let job_tier = tier.clone();
            let at_ms = tier.change_time(SystemClock.now_ms().max(0.0) as u64);
            tier.in_order_global(async move {
                let change = match stale_until {
                    None => Change::DeleteTags { tags, at_ms },
                    Some(stale_until) => Change::ExpireTags {
                        tags,
                        stale_until,
                        at_ms,
                    },
                };
                let _ = tx.send(job_tier.take_change(change).await);
            });
            (true, Some(tentative))
        }
        None => (false, None),
    };
    env.spawn_future_with_callback(
        async move {
            if !queued {
                return Ok(None);
            }
            Ok(Some(rx.await.unwrap_or(Taken::Closed)))
        },
        // On the JS thread, which owns the in-process tier.
        move |_, outcome| {
            Ok(match outcome {
                None => 0,
                Some(Taken::Now(_) | Taken::Later) => 1,
                Some(taken) => {
                    // Marked again when Redis takes it (its replay), at Redis's clock.
                    if let (Some(t), Some(e)) = (&tentative, engine(id)) {
                        e.borrow_mut().cache.revert_tags(t);
                    }
                    if taken == Taken::Queued {
                        QUEUED
                    } else {
                        UNAVAILABLE
                    }
                }
            })
        },
    )
    .map_err(|e| napi_fail(ErrorCode::Redis, e))
}

/// `clear()`: applied here at once (every entry dropped, every running load superseded), then
/// in Redis after this instance's earlier writes: the clear clock (every entry born before it
/// is dead everywhere), then a sweep that deletes those entries (SCAN, one batch at a time).
/// Resolves 1 once Redis holds the clear (a failed sweep is reported, not thrown: the entries
/// are dead already), 0 without Redis, `QUEUED` when Redis could not take it (replayed later,
/// swept then), `UNAVAILABLE` when it was not sent (closed).
#[napi]
pub fn clear_entries(env: &Env, id: u32) -> Result<PromiseRaw<'_, i32>, JsErr> {
    let (tx, rx) = oneshot::channel();
    let tier = with_engine(id, |e| {
        let owns_clock = e.redis.is_none();
        let tentative = e.cache.clear(owns_clock)?;
        Ok(e.redis.clone().map(|tier| (tier, tentative)))
    })?;
    let sweeper = tier.as_ref().map(|(tier, _)| tier.clone());
    if let Some((tier, tentative)) = tier {
        let job_tier = tier.clone();
        let at_ms = tier.change_time(SystemClock.now_ms().max(0.0) as u64);
        tier.in_order_global(async move {
            let change = Change::Clear { tentative, at_ms };
            let _ = tx.send(job_tier.take_change(change).await);
        });
    }
    settle::spawn_settled(env, async move {
        let Some(tier) = sweeper else {
            return Ok(0);
        };
        let clock = match rx.await {
            Ok(Taken::Now(Applied::Cleared { clock })) => clock,
            // Swept by the replay.
            Ok(Taken::Now(_) | Taken::Later) => return Ok(1),
            Ok(Taken::Queued) => return Ok(QUEUED),
            Ok(Taken::Closed) | Err(_) => return Ok(UNAVAILABLE),
        };
        // Outside the write order: later writes need not wait for it, and it never deletes
        // what they write (only entries born before the clear).
        let _ = tier.sweep(clock).await;
        Ok(1)
    })
    .map_err(|e| napi_fail(ErrorCode::Redis, e))
}
