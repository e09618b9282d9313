//! Many keys at once (`getMany`, `getOrLoadMany`): the binding's batch calls. Each answers one
//! `RedisAnswer` per key, in the order of `keys`, as `redisFetch` and `redisGate` answer one; the
//! facade ends each key's flight as it does for a single key (mod.rs, "Boundary rules").

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use super::answer::{answer_of, Landed, RedisAnswer};
use super::codes::{
    lock_code, GATE_CLOSED, GATE_MISSING, GATE_UNAVAILABLE, GATE_WAIT, PURPOSE_COLD,
};
use super::engines::engine;
use super::flight::{Flight, Gated};
use super::reads::{carried, carried_gate, For};
use super::settle;
use crate::inbox::Stamp;
use crate::store::redis::{Fetched, FirstLook, Gate, RedisTier};

/// The tier and lockTtl of a live cache, and each key's invalidation stamp taken now, on the JS
/// thread (before a later `set` or `delete` of this process can change it).
fn asked(id: u32, keys: &[String]) -> Option<(Arc<RedisTier>, f64, Vec<Stamp>)> {
    let e = engine(id)?;
    let e = e.borrow();
    if e.cache.is_closed() {
        return None;
    }
    let tier = e.redis.clone()?;
    let stamps = keys.iter().map(|k| e.cache.inbox().stamp(k)).collect();
    Some((tier, e.cache.options().lock_ttl, stamps))
}

/// The keys an announcement carried a value for are answered from it (`carried`: no Redis
/// read); the others are returned with their positions.
fn uncarried<A>(
    keys: Vec<String>,
    carried: impl Fn(usize, &str) -> Option<A>,
) -> (Vec<Option<A>>, Vec<(usize, String)>) {
    let mut answers: Vec<Option<A>> = Vec::with_capacity(keys.len());
    let mut rest = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        let found = carried(i, &key);
        if found.is_none() {
            rest.push((i, key));
        }
        answers.push(found);
    }
    (answers, rest)
}

/// The cold gates of the keys a batch leads, in one go: per key, `GATE_FOUND` (Redis has it),
/// `GATE_LEAD` (call the loader, holding the lock if a token is set), `GATE_WAIT` (another
/// process holds the lock: ask `redisGate` for this key alone, which waits for its value) or
/// `GATE_CLOSED`. The GETs go in one pipeline per cluster slot, then the lock bids likewise.
/// `flights`: each key's flight, whose record begins here (see `flight.rs`).
#[napi(ts_return_type = "Promise<unknown[]>")]
pub fn redis_gate_many(
    env: &Env,
    id: u32,
    keys: Vec<String>,
    flights: Vec<f64>,
) -> napi::Result<PromiseRaw<'_, Vec<Landed>>> {
    let to = |i: usize| For {
        id,
        flight: flights.get(i).map_or(0, |f| *f as u64),
    };
    begin_flights(id, &keys, &flights);
    let (mut answers, rest) = uncarried(keys, |i, key| carried_gate(to(i), key));
    let names: Vec<String> = rest.iter().map(|(_, k)| k.clone()).collect();
    let tier = asked(id, &names);
    settle::spawn_settled(env, async move {
        let landed = |i: usize, answer: RedisAnswer, gated: Gated| Landed {
            id,
            flight: flights.get(i).map_or(0, |f| *f as u64),
            answer,
            gated,
        };
        let Some((tier, lock_ttl, stamps)) = tier else {
            for (i, _) in &rest {
                answers[*i] = Some(landed(
                    *i,
                    RedisAnswer::kind(GATE_CLOSED, None),
                    Gated::Nothing,
                ));
            }
            return Ok(answers.into_iter().flatten().collect());
        };
        let asks: Vec<(String, Stamp)> = names.into_iter().zip(stamps.iter().copied()).collect();
        let looks = tier.cold_gate_many(&asks, lock_ttl as u64).await;
        let closed = tier.closed();
        for (((i, _), (key, stamp)), look) in rest.iter().zip(&asks).zip(looks) {
            let (answer, gated) = match look {
                FirstLook::Done(
                    Gate::Lead {
                        token: Some(token), ..
                    },
                    _,
                ) if closed => {
                    // Closed while asking: no loader runs, and a lock just taken goes back.
                    tier.release(key, &token, true).await;
                    (RedisAnswer::kind(GATE_CLOSED, Some(*stamp)), Gated::Nothing)
                }
                _ if closed => (RedisAnswer::kind(GATE_CLOSED, Some(*stamp)), Gated::Nothing),
                FirstLook::Done(gate, lock) => {
                    answer_of(&tier, key, gate, lock_code(lock), Some(*stamp))
                }
                FirstLook::Wait => (RedisAnswer::kind(GATE_WAIT, Some(*stamp)), Gated::Nothing),
            };
            answers[*i] = Some(landed(*i, answer, gated));
        }
        let reported = tier.reports_waiting();
        Ok(answers
            .into_iter()
            .flatten()
            .map(|l| Landed {
                answer: RedisAnswer {
                    reported,
                    ..l.answer
                },
                ..l
            })
            .collect())
    })
}

/// Begins the records of a batch's cold flights (`redisGate` begins one's).
fn begin_flights(id: u32, keys: &[String], flights: &[f64]) {
    let Some(e) = engine(id) else { return };
    let mut e = e.borrow_mut();
    if e.cache.is_closed() || e.redis.is_none() {
        return;
    }
    for (key, flight) in keys.iter().zip(flights) {
        e.flights
            .entry(*flight as u64)
            .or_insert_with(|| Flight::new(key.clone(), PURPOSE_COLD));
    }
}

/// Reads many keys from Redis (for `getMany`), as `redisFetch` reads one with `count`: found /
/// missing / unavailable per key, each counted as an l2Hit or a miss.
#[napi(ts_return_type = "Promise<unknown[]>")]
pub fn redis_fetch_many(
    env: &Env,
    id: u32,
    keys: Vec<String>,
) -> napi::Result<PromiseRaw<'_, Vec<RedisAnswer>>> {
    let (mut answers, rest) = uncarried(keys, |_, key| carried(id, key, true));
    let names: Vec<String> = rest.iter().map(|(_, k)| k.clone()).collect();
    let tier = asked(id, &names);
    settle::spawn_settled(env, async move {
        let Some((tier, _, stamps)) = tier else {
            for (i, _) in &rest {
                answers[*i] = Some(RedisAnswer::kind(GATE_UNAVAILABLE, None));
            }
            return Ok(answers.into_iter().flatten().collect());
        };
        let asks: Vec<(String, Stamp)> = names.into_iter().zip(stamps).collect();
        let fetched = tier.fetch_many(&asks, true).await;
        for ((i, _), f) in rest.iter().zip(fetched) {
            answers[*i] = Some(match f {
                Fetched::Found(r) => RedisAnswer::found(r),
                Fetched::Missing => RedisAnswer::kind(GATE_MISSING, None),
                Fetched::Unavailable => RedisAnswer::kind(GATE_UNAVAILABLE, None),
            });
        }
        let reported = tier.reports_waiting();
        Ok(answers
            .into_iter()
            .flatten()
            .map(|a| RedisAnswer { reported, ..a })
            .collect())
    })
}

/// A `loadMany` call is about to run: `loads` counts it once, however many keys it loads (its
/// keys' flights skip `noteLoaderCall`); `refresh`: a background refresh batch, counted once in
/// `refreshes` too.
#[napi]
pub fn note_batch_call(id: u32, refresh: bool) {
    if let Some(e) = engine(id) {
        let e = e.borrow();
        e.cache.stats.loads.incr();
        if refresh {
            e.cache.stats.refreshes.incr();
        }
    }
}

/// Registers the background refresh of one stale key of a batch (`beginRefresh` for a
/// `getOrLoadMany` call): its flight id, or -1 if one already runs or (`first`: no key of the batch
/// has a flight yet) the bound on refreshes running is reached. `seen`: the fresh-until of the
/// copy the caller was served from Redis (-1: from the in-process tier), the refresh's basis.
#[napi]
pub fn begin_batch_refresh(id: u32, key: String, first: bool, seen: f64) -> f64 {
    let seen = (seen >= 0.0).then_some(seen);
    engine(id)
        .and_then(|e| e.borrow_mut().cache.begin_batch_refresh(&key, first, seen))
        .map_or(-1.0, |f| f as f64)
}
