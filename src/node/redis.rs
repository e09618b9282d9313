//! The Redis operations of the binding. Each returns a promise; the tier works on napi's tokio
//! runtime. Writes (write-backs, `set`, `delete`, lock releases after failures) are queued in
//! call order per key here, synchronously on the JS thread, before anything is awaited.

use std::ptr;
use std::result::Result;
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi_derive::napi;
use tokio::sync::oneshot;

use super::codes::{
    hit_state, lock_code, DROPPED, GATE_CLOSED, GATE_FOUND, GATE_LEAD, GATE_MISSING, GATE_SKIP,
    GATE_UNAVAILABLE, LOCK_NONE, NOT_SENT, NO_SLOT, PURPOSE_COLD, PURPOSE_FORCE,
    PURPOSE_PAST_VALUE, PURPOSE_REFRESH, UNAVAILABLE, WRITTEN, WRITTEN_NOWHERE,
};
use super::engines::{engine, with_engine};
use super::options::policy_of;
use super::{hot_path, lane, napi_fail, settle, JsErr};
use crate::cache::{EntryState, Extra};
use crate::clock::{Clock, SystemClock};
use crate::envelope::{Body, Envelope, Fmt};
use crate::error::ErrorCode;
use crate::inbox::Stamp;
use crate::store::redis::{
    Fence, Fetched, Gate, LaneRead, LockOutcome, RedisTier, Remote, TagFailure, WriteBack,
};

/// The tier, lockTtl, and the in-process copy's freshUntil (0 if none) of a live cache.
fn tier_of(id: u32, key: &str) -> Option<(Arc<RedisTier>, f64, f64)> {
    let e = engine(id)?;
    let e = e.borrow();
    if e.cache.is_closed() {
        return None;
    }
    // What a refresh gate compares Redis's copy with: the copy the refresh replaces (with
    // `l1: false` there is no in-process entry to ask).
    let local_fresh_until = e.cache.refresh_basis(key).unwrap_or(0.0);
    Some((
        e.redis.clone()?,
        e.cache.options().lock_ttl,
        local_fresh_until,
    ))
}

fn tier(id: u32) -> Option<Arc<RedisTier>> {
    engine(id).and_then(|e| e.borrow().redis.clone())
}

/// A Redis answer; `kind` (a `GATE_*` code) says what to do next. `found`: the envelope's times, its tags, and the value as JSON (`json`
/// absent for a cached `undefined`; for a v8 or custom serializer, a JSON string of base64 or
/// text, as `fmt` says). `lead`: call the loader, holding the lock if `token` is set, fenced by
/// `fence`/`fencedAt` if set, born at `born` (hand them back to `writeBack`); `tags`: the
/// refreshed entry's.
///
/// It crosses to JS as the arguments of the facade's answer maker (`hot_path::make_answer`),
/// `(kind, json, freshUntil, hardUntil, computeMs, negative, retryAfter, stamp, born, fmt, state,
/// bytes, reported, lock, tags, token, fence, fencedAt)` (`bytes`: `json`'s UTF-8 length), which
/// makes the object the facade reads: as an object made here, its property names were interned
/// on every answer, and as an array, each element was set by its own N-API call.
pub struct RedisAnswer {
    pub kind: u32,
    pub token: Option<String>,
    pub fence: Option<String>,
    pub fenced_at: f64,
    pub json: Option<String>,
    pub fresh_until: f64,
    pub hard_until: f64,
    pub compute_ms: f64,
    pub negative: bool,
    pub retry_after: f64,
    /// The key's invalidation stamp before Redis was asked (hand it back to `adopt` or
    /// `finishWrite`); -1 for none.
    pub stamp: f64,
    /// What became of the bid for the lock (a `LOCK_*` code), for the facade's lock channel.
    pub lock: u32,
    /// The namespace clock the entry was born at (found), or Redis had at the gate (lead); -1
    /// for none.
    pub born: f64,
    pub tags: Option<Vec<String>>,
    /// The value's format (a `FMT_*` code).
    pub fmt: u32,
    /// `found`: the entry's state when Redis answered (fresh, stale or negative: an index in
    /// `HIT_STATES`), as `inspect` and the hit channel report it; -1 otherwise.
    pub state: i32,
    /// Failures wait for `onError` (`takeRedisReports`): the facade takes them only then.
    pub reported: bool,
}

impl TypeName for RedisAnswer {
    fn type_name() -> &'static str {
        "RedisAnswer"
    }

    fn value_type() -> ValueType {
        ValueType::Object
    }
}

impl ToNapiValue for RedisAnswer {
    unsafe fn to_napi_value(
        env: napi::sys::napi_env,
        a: Self,
    ) -> napi::Result<napi::sys::napi_value> {
        let bytes = a.json.as_ref().map_or(0.0, |j| j.len() as f64);
        let json = match &a.json {
            Some(j) => hot_path::js_string(env, j)?,
            // SAFETY (this and the conversions below): the caller's (napi-rs calls this on the
            // JS thread with its environment, in a handle scope).
            None => {
                // SAFETY: as above.
                unsafe { ToNapiValue::to_napi_value(env, Null)? }
            }
        };
        // The trailing five only when one is set (a lead, a lock outcome, tags): the facade's
        // defaults stand for them otherwise.
        let full = a.lock != LOCK_NONE
            || a.tags.is_some()
            || a.token.is_some()
            || a.fence.is_some()
            || a.fenced_at != -1.0;
        let mut args = [ptr::null_mut(); 18];
        // SAFETY: the conversions run on the JS thread with its environment, in napi-rs's
        // handle scope (see above); each writes a fresh value.
        let given = unsafe {
            args[..13].copy_from_slice(&[
                ToNapiValue::to_napi_value(env, a.kind)?,
                json,
                ToNapiValue::to_napi_value(env, a.fresh_until)?,
                ToNapiValue::to_napi_value(env, a.hard_until)?,
                ToNapiValue::to_napi_value(env, a.compute_ms)?,
                ToNapiValue::to_napi_value(env, a.negative)?,
                ToNapiValue::to_napi_value(env, a.retry_after)?,
                ToNapiValue::to_napi_value(env, a.stamp)?,
                ToNapiValue::to_napi_value(env, a.born)?,
                ToNapiValue::to_napi_value(env, a.fmt)?,
                ToNapiValue::to_napi_value(env, a.state)?,
                ToNapiValue::to_napi_value(env, bytes)?,
                ToNapiValue::to_napi_value(env, a.reported)?,
            ]);
            if full {
                args[13..].copy_from_slice(&[
                    ToNapiValue::to_napi_value(env, a.lock)?,
                    ToNapiValue::to_napi_value(env, a.tags)?,
                    ToNapiValue::to_napi_value(env, a.token)?,
                    ToNapiValue::to_napi_value(env, a.fence)?,
                    ToNapiValue::to_napi_value(env, a.fenced_at)?,
                ]);
                18
            } else {
                13
            }
        };
        hot_path::make_answer(env, &args[..given])
    }
}

impl RedisAnswer {
    pub(super) fn kind(kind: u32, stamp: Option<Stamp>) -> Self {
        RedisAnswer {
            kind,
            token: None,
            fence: None,
            fenced_at: -1.0,
            json: None,
            fresh_until: 0.0,
            hard_until: 0.0,
            compute_ms: 0.0,
            negative: false,
            retry_after: 0.0,
            stamp: stamp.map_or(-1.0, |s| s.0 as f64),
            lock: LOCK_NONE,
            born: -1.0,
            tags: None,
            fmt: 0,
            state: -1,
            reported: false,
        }
    }

    /// The same answer, saying whether `tier` has failures waiting for `onError`.
    pub(super) fn reporting(self, tier: &RedisTier) -> Self {
        RedisAnswer {
            reported: tier.reports_waiting(),
            ..self
        }
    }

    pub(super) fn found(r: Remote) -> Self {
        let e = r.envelope;
        RedisAnswer {
            json: r.value_json,
            fresh_until: e.fresh_until,
            hard_until: e.hard_until,
            compute_ms: e.compute_ms,
            negative: e.negative,
            retry_after: e.retry_after,
            born: e.born as f64,
            tags: (!r.tags.is_empty()).then_some(r.tags),
            fmt: r.fmt.code(),
            // Redis keeps an entry until its hardUntil, so one found is live (past hardUntil by
            // this clock, it reads as stale).
            state: hit_state(EntryState::of_live(&e, SystemClock.now_ms())),
            ..RedisAnswer::kind(GATE_FOUND, Some(r.stamp))
        }
    }
}

/// Asks Redis before a load (`purpose`: a `PURPOSE_*` code; anything unknown is a cold load):
/// found / lead / skip / closed. A cold load takes the value an announcement carried, answered
/// at once (not a promise), or else reads on the read lane when it can.
#[napi(ts_return_type = "unknown[] | Promise<unknown[]>")]
pub fn redis_gate(
    env: &Env,
    id: u32,
    key: String,
    purpose: u32,
) -> napi::Result<Either<RedisAnswer, PromiseRaw<'_, RedisAnswer>>> {
    if purpose == PURPOSE_COLD {
        if let Some(found) = carried(id, &key, false) {
            return Ok(Either::A(found));
        }
    }
    let tier = tier_of(id, &key);
    // Taken before Redis is asked: an invalidation after this may predate our read.
    let stamp = engine(id).map(|e| e.borrow().cache.inbox().stamp(&key));
    let purpose = match purpose {
        PURPOSE_REFRESH | PURPOSE_FORCE | PURPOSE_PAST_VALUE => purpose,
        _ => PURPOSE_COLD,
    };
    if let (PURPOSE_COLD, Some((tier, lock_ttl, _)), Some(stamp)) = (purpose, &tier, stamp) {
        let ask = LaneAsk::Cold {
            lock_ttl: *lock_ttl,
        };
        if let Some(promise) = lane::read(env, id, tier, key.clone(), stamp, ask)? {
            return Ok(Either::B(promise));
        }
    }
    settle::spawn_settled(env, gate(tier, key, purpose, stamp, false)).map(Either::B)
}

/// The gate, on the runtime. `looked`: a cold load whose read lane's GET found nothing usable.
async fn gate(
    tier: Option<(Arc<RedisTier>, f64, f64)>,
    key: String,
    purpose: u32,
    stamp: Option<Stamp>,
    looked: bool,
) -> napi::Result<RedisAnswer> {
    let Some((tier, lock_ttl, local_fresh_until)) = tier else {
        return Ok(RedisAnswer::kind(GATE_CLOSED, stamp));
    };
    let (gate, lock) = match purpose {
        PURPOSE_REFRESH => {
            let gate = tier
                .refresh_gate(&key, lock_ttl as u64, local_fresh_until)
                .await;
            // The refresh gate takes the lock before it looks (a value found was refreshed
            // elsewhere meanwhile; the lock is given back): a win, as `lockWins` counts.
            let lock = match &gate {
                Gate::Lead { token: Some(_), .. } | Gate::Found(_) => LockOutcome::Won,
                Gate::Skip => LockOutcome::Skipped,
                _ => LockOutcome::None,
            };
            (gate, lock)
        }
        PURPOSE_FORCE => (tier.force_gate(&key).await, LockOutcome::None),
        PURPOSE_PAST_VALUE => {
            tier.cold_gate_observed(&key, lock_ttl as u64, true, false)
                .await
        }
        _ => {
            tier.cold_gate_observed(&key, lock_ttl as u64, false, looked)
                .await
        }
    };
    // Closed while asking: no loader runs, and a lock just taken is given back at once.
    let gate = if tier.closed() {
        if let Gate::Lead {
            token: Some(token), ..
        } = &gate
        {
            tier.release(&key, token, true).await;
        }
        Gate::Closed
    } else {
        gate
    };
    Ok(answer_of(gate, lock_code(lock), stamp).reporting(&tier))
}

/// The answer for what a gate decided (`lock`: a `LOCK_*` code; `stamp`: the key's stamp taken
/// before Redis was asked).
pub(super) fn answer_of(gate: Gate, lock: u32, stamp: Option<Stamp>) -> RedisAnswer {
    match gate {
        Gate::Found(r) => RedisAnswer {
            lock,
            ..RedisAnswer::found(r)
        },
        Gate::Lead {
            token,
            fence,
            stamp: looked,
            born,
            tags,
        } => RedisAnswer {
            token,
            fenced_at: fence.as_ref().map_or(-1.0, |f| f.read_at_ms),
            fence: fence.map(|f| f.state),
            lock,
            born: born.map_or(-1.0, |b| b as f64),
            tags: (!tags.is_empty()).then_some(tags),
            ..RedisAnswer::kind(GATE_LEAD, looked.or(stamp))
        },
        Gate::Skip => RedisAnswer {
            lock,
            ..RedisAnswer::kind(GATE_SKIP, stamp)
        },
        Gate::Closed => RedisAnswer::kind(GATE_CLOSED, stamp),
    }
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
    let tier = tier_of(id, &key).map(|(tier, _, _)| tier);
    // Here, on the JS thread, before a set or delete called after this read can touch it.
    let stamp = engine(id).map(|e| e.borrow().cache.inbox().stamp(&key));
    if let (Some(tier), Some(stamp)) = (&tier, stamp) {
        if let Some(promise) =
            lane::read(env, id, tier, key.clone(), stamp, LaneAsk::Fetch { count })?
        {
            return Ok(Either::B(promise));
        }
    }
    settle::spawn_settled(env, fetch(tier, key, stamp, count)).map(Either::B)
}

async fn fetch(
    tier: Option<Arc<RedisTier>>,
    key: String,
    stamp: Option<Stamp>,
    count: bool,
) -> napi::Result<RedisAnswer> {
    let (Some(tier), Some(stamp)) = (tier, stamp) else {
        return Ok(RedisAnswer::kind(GATE_UNAVAILABLE, None));
    };
    let answer = match tier.fetch(&key, stamp, count).await {
        Fetched::Found(r) => RedisAnswer::found(r),
        Fetched::Missing => RedisAnswer::kind(GATE_MISSING, None),
        Fetched::Unavailable => RedisAnswer::kind(GATE_UNAVAILABLE, None),
    };
    Ok(answer.reporting(&tier))
}

/// What a read sent on the read lane was for.
#[derive(Clone, Copy)]
pub(super) enum LaneAsk {
    /// A cold load's gate (`redis_gate`, `PURPOSE_COLD`).
    Cold { lock_ttl: f64 },
    /// `redis_fetch`.
    Fetch { count: bool },
}

impl LaneAsk {
    pub(super) fn counted(self) -> bool {
        matches!(self, LaneAsk::Fetch { count: true })
    }
}

/// Settles a read the lane answered (`read`), or asks again on the command connection (`None`:
/// the lane failed or was dropped before it answered). On the JS thread, in a handle scope.
pub(super) fn settle_lane_read(
    env: napi::sys::napi_env,
    tier: &Arc<RedisTier>,
    promised: settle::Promised,
    key: String,
    stamp: Stamp,
    ask: LaneAsk,
    read: Option<LaneRead>,
) {
    let answer = match (read, ask) {
        (Some(LaneRead::Found(r)), LaneAsk::Cold { .. }) if tier.closed() => {
            drop(r);
            RedisAnswer::kind(GATE_CLOSED, Some(stamp))
        }
        (Some(LaneRead::Found(r)), _) => RedisAnswer::found(r),
        (Some(LaneRead::Missing), LaneAsk::Fetch { .. }) => RedisAnswer::kind(GATE_MISSING, None),
        (Some(LaneRead::Missing), LaneAsk::Cold { lock_ttl }) => {
            // The lock script runs next, without a GET of its own first.
            let tier = Some((tier.clone(), lock_ttl, 0.0));
            settle::spawn_into(promised, gate(tier, key, PURPOSE_COLD, Some(stamp), true));
            return;
        }
        (Some(LaneRead::Ask | LaneRead::Misaligned(_)) | None, LaneAsk::Cold { lock_ttl }) => {
            let tier = Some((tier.clone(), lock_ttl, 0.0));
            settle::spawn_into(promised, gate(tier, key, PURPOSE_COLD, Some(stamp), false));
            return;
        }
        (Some(LaneRead::Ask | LaneRead::Misaligned(_)) | None, LaneAsk::Fetch { count }) => {
            settle::spawn_into(promised, fetch(Some(tier.clone()), key, Some(stamp), count));
            return;
        }
    };
    settle::settle_here(env, promised, Ok(answer.reporting(tier)));
}

/// Takes an envelope read from Redis into the in-process tier, ending `flight` (-1: none).
/// `cold`: the flight is a cold load, whose caller starts the refresh of a stale value found,
/// or of a fresh one an XFetch draw at `beta` (-1: the constructor's) picks (a refresh found
/// refreshed elsewhere, and `get`, start none).
///
/// Answers `slot * 2 + refresh`: the slot for the value (`NO_SLOT` when the tier keeps nothing,
/// `WRITTEN_NOWHERE` when superseded, expired or dead; read it back with `>> 1`), and whether
/// the caller, served a stale value, should start its refresh (`& 1`). A number, not an object:
/// an object's property names are interned on every call.
#[napi]
pub fn adopt(
    id: u32,
    key: String,
    flight: f64,
    cold: bool,
    fresh_until: f64,
    hard_until: f64,
    compute_ms: f64,
    negative: bool,
    retry_after: f64,
    stamp: f64,
    born: f64,
    tags: Option<Vec<String>>,
    size: f64,
    beta: f64,
) -> i32 {
    let stamp = (stamp >= 0.0).then_some(Stamp(stamp as u64));
    let envelope = Envelope {
        fresh_until,
        hard_until,
        compute_ms,
        negative,
        retry_after,
        born: born.max(0.0) as u64,
    };
    let flight = (flight >= 0.0).then_some(flight as u64);
    let extra = Extra {
        tags: tags.unwrap_or_default(),
        size: size as u64,
    };
    with_engine(id, |e| {
        // A write of the key by this instance is queued or unanswered: Redis may have run this
        // read before it (the read's stamp already includes the write's call). Served, not kept.
        let stamp = if e.redis.as_ref().is_some_and(|t| t.writing(&key)) {
            Some(Stamp::OUTDATED)
        } else {
            stamp
        };
        // Decided whether or not the entry is kept here: the caller was served it either way.
        let beta = if beta >= 0.0 {
            beta
        } else {
            e.cache.options().defaults.beta
        };
        let refresh = cold && e.cache.served_refresh_due(&envelope, beta);
        let slot = match e.cache.adopt(&key, flight, envelope, extra, stamp) {
            None => WRITTEN_NOWHERE,
            Some(slot) => slot.map_or(NO_SLOT, |s| s as i32),
        };
        Ok(slot * 2 + i32::from(refresh))
    })
    .unwrap_or(WRITTEN_NOWHERE * 2)
}

/// Another process holds the refresh: end `flight` and hold local refreshes back meanwhile.
#[napi]
pub fn abandon(id: u32, key: String, flight: f64) {
    let _ = with_engine(id, |e| {
        // Until the holder announces its result, or at most a second, or its lock's life.
        let hold = e.cache.options().lock_ttl.min(1_000.0);
        e.cache.abandon(&key, flight as u64, hold);
        Ok(())
    });
}

/// The loader of `flight` returned: prepares its entry (the flight stays registered, so callers
/// keep joining it) and writes it back to Redis, fenced by what the gate read, after this
/// instance's earlier writes of the key; always releases `token`'s lock. Resolves with what
/// became of it (`WRITTEN`, `DROPPED`, `UNAVAILABLE`, `NOT_SENT`); then call `finish_write`,
/// whose `keep` is "not `DROPPED`". `tags`, `inherit`,
/// `size` as for `complete`; `born`: the gate's (-1: none); `fmt`: a `FMT_*` code.
#[napi]
pub fn write_back(
    env: &Env,
    id: u32,
    key: String,
    flight: f64,
    compute_ms: f64,
    negative: bool,
    policy: Option<Vec<f64>>,
    value_json: Option<String>,
    token: Option<String>,
    fence: Option<String>,
    fenced_at: f64,
    forced: bool,
    tags: Option<Vec<String>>,
    inherit: bool,
    size: f64,
    born: f64,
    fmt: u32,
) -> napi::Result<PromiseRaw<'_, i32>> {
    let (tx, rx) = oneshot::channel();
    let queued = engine(id).and_then(|e| {
        let mut e = e.borrow_mut();
        let p = policy_of(&e, policy.as_deref());
        let extra = Extra {
            tags: tags.unwrap_or_default(),
            size: size as u64,
        };
        let gate_born = (born >= 0.0).then_some(born as u64);
        let prepared = e.cache.prepare(
            &key,
            flight as u64,
            compute_ms,
            negative,
            &p,
            extra,
            inherit,
            gate_born,
        );
        if let Some(p) = &prepared {
            e.prepared.insert(flight as u64, p.clone());
        }
        let tier = e.redis.clone()?;
        let fence = fence.map(|state| Fence {
            state,
            read_at_ms: fenced_at,
        });
        let job_tier = tier.clone();
        let job_key = key.clone();
        tier.in_order(&key, async move {
            let written = prepared.flatten();
            let body = written.as_ref().map(|p| Body {
                value_json: value_json.as_deref(),
                tags: &p.extra.tags,
                fmt: Fmt::from_code(fmt),
            });
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
/// invalidated since `stamp`).
#[napi]
pub fn finish_write(id: u32, key: String, flight: f64, keep: bool, stamp: f64) -> i32 {
    let stamp = (stamp >= 0.0).then_some(Stamp(stamp as u64));
    with_engine(id, |e| {
        let Some(prepared) = e.prepared.remove(&(flight as u64)) else {
            // Superseded before it was prepared: only the flight ends.
            e.cache.finish_write(&key, flight as u64, None, false, None);
            return Ok(WRITTEN_NOWHERE);
        };
        let keep = keep && prepared.is_some();
        Ok(
            match e
                .cache
                .finish_write(&key, flight as u64, prepared, keep, stamp)
            {
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
/// `UNAVAILABLE` when Redis could not take the change.
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
        let tier = e.redis.clone()?;
        if !delete && written.is_none() {
            return None;
        }
        let job_tier = tier.clone();
        let job_key = key.clone();
        tier.in_order(&key, async move {
            let entry = if delete { None } else { written };
            let body = entry.as_ref().map(|(_, tags)| Body {
                value_json: value_json.as_deref(),
                tags,
                fmt: Fmt::from_code(fmt),
            });
            let outcome = job_tier
                .write(
                    &job_key,
                    entry.as_ref().zip(body.as_ref()).map(|((e, _), b)| (e, b)),
                )
                .await;
            let _ = tx.send(outcome);
        });
        Some(())
    });
    settle::spawn_settled(env, async move {
        if queued.is_none() {
            return Ok(UNAVAILABLE);
        }
        Ok(match rx.await {
            Ok(Ok(existed)) => existed as i32,
            _ => UNAVAILABLE,
        })
    })
}

/// A load holding `token` failed or timed out: release the lock (announcing it, so waiters
/// take over at once); a failed refresh first records `retry_after` in the Redis envelope.
#[napi]
pub fn redis_failed(
    env: &Env,
    id: u32,
    key: String,
    token: Option<String>,
    retry_after: f64,
) -> napi::Result<PromiseRaw<'_, ()>> {
    let (tx, rx) = oneshot::channel::<()>();
    if let Some(tier) = tier(id) {
        let job_tier = tier.clone();
        let job_key = key.clone();
        tier.in_order(&key, async move {
            job_tier
                .record_failure(&job_key, token.as_deref(), retry_after)
                .await;
            let _ = tx.send(());
        });
    }
    settle::spawn_settled(env, async move {
        let _ = rx.await;
        Ok(())
    })
}

#[napi(object)]
pub struct RedisReport {
    pub op: String,
    pub key: Option<String>,
    pub message: String,
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
    reports
        .take()
        .into_iter()
        .map(|r| RedisReport {
            op: r.op.to_string(),
            key: r.key,
            message: config.scrub(&r.message),
        })
        .collect()
}

#[napi]
pub fn has_redis(id: u32) -> bool {
    engine(id).is_some_and(|e| e.borrow().redis.is_some())
}

/// `deleteByTag(tags)`: applied here at once (every entry carrying one of them, and every load
/// that began before and will carry one, is dead), then in Redis after this instance's earlier
/// writes (later ones wait for it). Resolves 1 once Redis holds it, 0 without Redis,
/// `UNAVAILABLE` when Redis could not take it (the effect here is kept; see `Cache::revert_tags`).
#[napi]
pub fn delete_tags(env: &Env, id: u32, tags: Vec<String>) -> Result<PromiseRaw<'_, i32>, JsErr> {
    let (tx, rx) = oneshot::channel();
    let tier = with_engine(id, |e| {
        let owns_clock = e.redis.is_none();
        let tentative = e.cache.delete_tags(&tags, owns_clock)?;
        Ok(e.redis.clone().map(|tier| (tier, tentative)))
    })?;
    let (queued, tentative) = match tier {
        Some((tier, tentative)) => {
            let job_tier = tier.clone();
            tier.in_order_global(async move {
                let _ = tx.send(job_tier.delete_tags(&tags).await);
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
            Ok(Some(rx.await.unwrap_or(Err(TagFailure::NotTaken))))
        },
        // On the JS thread, which owns the in-process tier.
        move |_, outcome| {
            Ok(match outcome {
                None => 0,
                Some(Ok(())) => 1,
                Some(Err(failure)) => {
                    if let (TagFailure::NotTaken, Some(t)) = (failure, &tentative) {
                        if let Some(e) = engine(id) {
                            e.borrow_mut().cache.revert_tags(t);
                        }
                    }
                    UNAVAILABLE
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
/// are dead already), 0 without Redis, `UNAVAILABLE` when Redis could not take it.
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
        tier.in_order_global(async move {
            let _ = tx.send(job_tier.clear(&tentative).await.ok());
        });
    }
    settle::spawn_settled(env, async move {
        let Some(tier) = sweeper else {
            return Ok(0);
        };
        let Ok(Some(clock)) = rx.await else {
            return Ok(UNAVAILABLE);
        };
        // Outside the write order: later writes need not wait for it, and it never deletes
        // what they write (only entries born before the clear).
        let _ = tier.sweep(clock).await;
        Ok(1)
    })
    .map_err(|e| napi_fail(ErrorCode::Redis, e))
}

/// The envelope another process's announcement carried for `key` (see
/// `store/redis/carried.rs`), as a found answer, if nothing was heard of the key since: the read
/// needs no Redis round trip. `count` (for `get`): counted as an l2Hit.
pub(super) fn carried(id: u32, key: &str, count: bool) -> Option<RedisAnswer> {
    let e = engine(id)?;
    let (tier, stamp) = {
        let e = e.borrow();
        if e.cache.is_closed() {
            return None;
        }
        (e.redis.clone()?, e.cache.inbox().stamp(key))
    };
    let found = tier.take_carried(key, stamp)?;
    if count {
        tier.count_l2_hit();
    }
    Some(RedisAnswer::found(found).reporting(&tier))
}
