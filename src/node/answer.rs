//! What a Redis read answers JS (`RedisAnswer`), and a gate's answer for a flight (`Landed`),
//! whose part for the flight's record lands in the engine as it crosses to JS.

use std::ptr;
use std::sync::Arc;

use napi::bindgen_prelude::*;

use super::codes::{hit_state, GATE_CLOSED, GATE_FOUND, GATE_LEAD, GATE_SKIP, LOCK_NONE};
use super::engines::engine;
use super::flight::{Found, Gated, Ticket};
use super::hot_path;
use crate::cache::EntryState;
use crate::clock::{Clock, SystemClock};
use crate::inbox::Stamp;
use crate::store::redis::{Gate, HeldLock, RedisTier, Remote};

/// A Redis answer; `kind` (a `GATE_*` code) says what to do next. `found`: the envelope's
/// times, its tags, and the value as JSON (`json` absent for a cached `undefined`; for a v8 or
/// custom serializer, a JSON string of base64 or text, as `fmt` says). `lead`: call the loader
/// (its ticket stays in the flight's record, see `flight.rs`).
///
/// It crosses to JS as the arguments of the facade's answer maker (`hot_path::make_answer`),
/// `(kind, json, freshUntil, hardUntil, computeMs, negative, retryAfter, stamp, born, fmt, state,
/// bytes, reported, lock, tags)` (`bytes`: `json`'s UTF-8 length), which makes the object the
/// facade reads: as an object made here, its property names were interned on every answer, and
/// as an array, each element was set by its own N-API call.
pub struct RedisAnswer {
    pub kind: u32,
    pub json: Option<String>,
    pub fresh_until: f64,
    pub hard_until: f64,
    pub compute_ms: f64,
    pub negative: bool,
    pub retry_after: f64,
    /// The key's invalidation stamp before Redis was asked (a read's, handed back to
    /// `adoptRead`); -1 for none.
    pub stamp: f64,
    /// What became of the bid for the lock (a `LOCK_*` code), for the facade's lock channel.
    pub lock: u32,
    /// The namespace clock the entry was born at (found); -1 for none.
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
        // The trailing two only when one is set (a lock outcome, tags): the facade's defaults
        // stand for them otherwise.
        let full = a.lock != LOCK_NONE || a.tags.is_some();
        let mut args = [ptr::null_mut(); 15];
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
                ]);
                15
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

    /// A found entry for a flight: the answer JS decodes, and what `adopt` keeps of it (the
    /// tags stay here).
    pub(super) fn found_for_flight(mut r: Remote) -> (Self, Gated) {
        let found = Found {
            envelope: r.envelope,
            tags: std::mem::take(&mut r.tags),
            stamp: Some(r.stamp),
            size: r.value_json.as_ref().map_or(0, |j| j.len() as u64),
        };
        (RedisAnswer::found(r), Gated::Found(found))
    }
}

/// A gate's answer for flight `flight` of engine `id`: JS is given `answer`, and the flight's
/// record `gated` (on the JS thread, as the answer crosses, so the record has it before any JS
/// reads the answer). A record gone by then (the cache closed) drops it: a lock goes back.
pub struct Landed {
    pub id: u32,
    pub flight: u64,
    pub answer: RedisAnswer,
    pub gated: Gated,
}

impl Landed {
    /// The same answer, saying whether `tier` has failures waiting for `onError`.
    pub(super) fn reporting(self, tier: &RedisTier) -> Self {
        Landed {
            answer: self.answer.reporting(tier),
            ..self
        }
    }
}

impl ToNapiValue for Landed {
    unsafe fn to_napi_value(
        env: napi::sys::napi_env,
        l: Self,
    ) -> napi::Result<napi::sys::napi_value> {
        if let Some(e) = engine(l.id) {
            if let Some(f) = e.borrow_mut().flights.get_mut(&l.flight) {
                f.gated = l.gated;
            }
        }
        // SAFETY: the caller's (on the JS thread with its environment, in a handle scope).
        unsafe { RedisAnswer::to_napi_value(env, l.answer) }
    }
}

/// The answer for what a gate decided for `key` (`lock`: a `LOCK_*` code; `stamp`: the key's
/// stamp taken before Redis was asked), and what the flight's record keeps of it: a lead's
/// ticket, holding `tier`'s lock if it won one.
pub(super) fn answer_of(
    tier: &Arc<RedisTier>,
    key: &str,
    gate: Gate,
    lock: u32,
    stamp: Option<Stamp>,
) -> (RedisAnswer, Gated) {
    match gate {
        Gate::Found(r) => {
            let (answer, found) = RedisAnswer::found_for_flight(r);
            (RedisAnswer { lock, ..answer }, found)
        }
        Gate::Lead {
            token,
            fence,
            stamp: looked,
            born,
            tags,
        } => {
            let stamp = looked.or(stamp);
            let ticket = Ticket {
                lock: token.map(|t| HeldLock::new(tier.clone(), key.to_string(), t)),
                fence,
                born,
                stamp,
                tags,
            };
            (
                RedisAnswer {
                    lock,
                    ..RedisAnswer::kind(GATE_LEAD, stamp)
                },
                Gated::Lead(ticket),
            )
        }
        Gate::Skip => (
            RedisAnswer {
                lock,
                ..RedisAnswer::kind(GATE_SKIP, stamp)
            },
            Gated::Nothing,
        ),
        Gate::Closed => (RedisAnswer::kind(GATE_CLOSED, stamp), Gated::Nothing),
    }
}
