//! The numbers the binding and the facade agree on: what a call answers, and the indexes of the
//! arrays they pass. Each is exported to JS under the same name (`native.d.ts` lists them), and
//! the facade (`lib/`) reads them once, at load, so no number is declared twice.

use napi_derive::napi;

use crate::cache::{EntryState, Hit};
use crate::envelope::Fmt;
use crate::store::redis::LockOutcome;

/// A hit (from `peek`, `lookup` or `getEntry`) is one integer, so the hot path returns a number
/// and allocates nothing: `slot << HIT_SLOT_SHIFT | kind << HIT_KIND_SHIFT | refresh`. A miss is
/// negative (`MISS`).
#[napi]
pub const HIT_SLOT_SHIFT: u32 = 3;
/// A hit's kind is `(n >> HIT_KIND_SHIFT) & HIT_KIND_MASK`, an index in `HIT_STATES`.
#[napi]
pub const HIT_KIND_SHIFT: u32 = 1;
#[napi]
pub const HIT_KIND_MASK: u32 = 3;
/// Set in a hit that asks the facade to start a background refresh.
#[napi]
pub const HIT_REFRESH: u32 = 1;
/// The state of a hit of each kind, as the hit channel reports it.
#[napi]
pub const HIT_STATES: [&str; 3] = [
    EntryState::Fresh.as_str(),
    EntryState::Stale.as_str(),
    EntryState::Negative.as_str(),
];
/// No usable entry.
#[napi]
pub const MISS: i32 = -1;
/// The longest key, in UTF-8 bytes.
#[napi]
pub const MAX_KEY_BYTES: u32 = crate::key::MAX_KEY_BYTES as u32;

/// A Redis answer's `state`: its index in `HIT_STATES`.
pub(super) const fn hit_state(state: EntryState) -> i32 {
    match state {
        EntryState::Fresh => 0,
        EntryState::Stale => 1,
        EntryState::Negative => 2,
    }
}

pub(super) fn encode_hit(hit: Hit) -> i32 {
    // Indexes in HIT_STATES.
    let kind = match hit {
        Hit::Fresh { .. } => 0,
        Hit::Stale { .. } => 1,
        Hit::Negative { .. } => 2,
    };
    let refresh = if hit.wants_refresh() { HIT_REFRESH } else { 0 };
    ((hit.slot() as i32) << HIT_SLOT_SHIFT) | (kind << HIT_KIND_SHIFT) | refresh as i32
}

/// The index of fresh entries' shared words (`freshIndex`, see `src/fresh.rs`): the 32-bit
/// word indexes of the epoch, the touch generation, the touch log's length and its first slot,
/// the f64 index of `until`, and how many slots the log holds.
#[napi]
pub const FRESH_EPOCH: u32 = crate::fresh::EPOCH_WORD as u32;
#[napi]
pub const FRESH_TOUCH_GEN: u32 = crate::fresh::TOUCH_GEN_WORD as u32;
#[napi]
pub const FRESH_UNTIL: u32 = crate::fresh::UNTIL_F64 as u32;
#[napi]
pub const FRESH_TOUCH_LEN: u32 = crate::fresh::TOUCH_LEN_WORD as u32;
#[napi]
pub const FRESH_TOUCHES: u32 = crate::fresh::TOUCHES_WORD as u32;
#[napi]
pub const FRESH_TOUCH_CAP: u32 = crate::fresh::TOUCH_CAP as u32;

/// `lookup` answers `n * STEP_KINDS + kind`.
#[napi]
pub const STEP_KINDS: u32 = 4;
/// What `lookup` says to do (its `kind`): serve the hit `n`.
#[napi]
pub const STEP_SERVE: u32 = 0;
/// Lead flight `n`: ask Redis if configured, call the loader, end the flight.
#[napi]
pub const STEP_LEAD: u32 = 1;
/// Join flight `n`: await its leader's promise.
#[napi]
pub const STEP_JOIN: u32 = 2;

/// A write answers the slot to keep its value at (`>= 0`), or this when the in-process tier keeps
/// nothing (Redis may).
#[napi]
pub const NO_SLOT: i32 = -1;
/// A write kept nowhere: a superseded flight, a zero TTL, a result Redis dropped.
#[napi]
pub const WRITTEN_NOWHERE: i32 = -2;

/// A call's policy as the facade holds it (`resolvePolicy`, `defaultPolicy`) is an array of
/// `POLICY_FIELDS` numbers, indexed by the `POLICY_*` codes.
#[napi]
pub const POLICY_TTL: u32 = 0;
#[napi]
pub const POLICY_HARD_TTL: u32 = 1;
#[napi]
pub const POLICY_NEGATIVE_TTL: u32 = 2;
#[napi]
pub const POLICY_JITTER: u32 = 3;
#[napi]
pub const POLICY_BETA: u32 = 4;
#[napi]
pub const POLICY_LOAD_TIMEOUT: u32 = 5;
#[napi]
pub const POLICY_FIELDS: u32 = 6;

/// What a flight is for, and asks Redis for (`redisGate`'s `purpose`): a load on a miss.
#[napi]
pub const PURPOSE_COLD: u32 = 0;
/// A background refresh of a stale or early-refreshed entry.
#[napi]
pub const PURPOSE_REFRESH: u32 = 1;
/// A `forceRefresh` call.
#[napi]
pub const PURPOSE_FORCE: u32 = 2;
/// A cold load whose serializer could not read the value Redis has: the lock is taken past it.
#[napi]
pub const PURPOSE_PAST_VALUE: u32 = 3;
/// The `reason` the channels give a flight, by purpose (`PURPOSE_COLD` to `PURPOSE_FORCE`).
#[napi]
pub const REASONS: [&str; 3] = ["cold", "refresh", "force"];

/// What a Redis answer says to do next (`RedisAnswer.kind`): take the entry Redis has (`adopt`).
#[napi]
pub const GATE_FOUND: u32 = 0;
/// Call the loader (holding the lock if the answer has a token).
#[napi]
pub const GATE_LEAD: u32 = 1;
/// Another process holds the refresh: `abandon` the flight.
#[napi]
pub const GATE_SKIP: u32 = 2;
/// `redisFetch`: Redis has no entry.
#[napi]
pub const GATE_MISSING: u32 = 3;
/// `redisFetch`: Redis could not be asked.
#[napi]
pub const GATE_UNAVAILABLE: u32 = 4;
/// The cache closed meanwhile: no loader runs.
#[napi]
pub const GATE_CLOSED: u32 = 5;
/// `redisGateMany`: another process holds the key's lock (or the batch's look found a value only
/// the single-key gate can judge): ask `redisGate` for this key alone, which waits for it.
#[napi]
pub const GATE_WAIT: u32 = 6;

/// What became of a bid for the Redis lock (`RedisAnswer.lock`, see `LockOutcome`): no bid.
#[napi]
pub const LOCK_NONE: u32 = 0;
#[napi]
pub const LOCK_WON: u32 = 1;
#[napi]
pub const LOCK_WAITED: u32 = 2;
#[napi]
pub const LOCK_TOOK_OVER: u32 = 3;
#[napi]
pub const LOCK_GAVE_UP: u32 = 4;
#[napi]
pub const LOCK_SKIPPED: u32 = 5;
/// The `outcome` the lock channel reports, by `LOCK_*` code (no bid is not reported).
#[napi]
pub const LOCK_OUTCOMES: [&str; 6] = ["none", "won", "waited", "took_over", "gave_up", "skipped"];

pub(super) fn lock_code(outcome: LockOutcome) -> u32 {
    match outcome {
        LockOutcome::None => LOCK_NONE,
        LockOutcome::Won => LOCK_WON,
        LockOutcome::Waited => LOCK_WAITED,
        LockOutcome::TookOver => LOCK_TOOK_OVER,
        LockOutcome::GaveUp => LOCK_GAVE_UP,
        LockOutcome::Skipped => LOCK_SKIPPED,
    }
}

/// What became of a write sent to Redis: a write-back (`writeBack`: all four), or a `set`,
/// `delete`, `deleteByTag` or `clear` (`UNAVAILABLE`). Written.
#[napi]
pub const WRITTEN: i32 = 1;
/// Redis holds something newer: keep nothing.
#[napi]
pub const DROPPED: i32 = 0;
/// Redis could not take it.
#[napi]
pub const UNAVAILABLE: i32 = -1;
/// Nothing was sent: nothing to write (superseded, closed), or the load began unfenced or too
/// long ago (kept in process only).
#[napi]
pub const NOT_SENT: i32 = -2;
/// A `set`, `delete`, `deleteByTag` or `clear` Redis could not take: queued, and replayed once
/// Redis answers again.
#[napi]
pub const QUEUED: i32 = -3;

/// How a value is written in the Redis envelope (`fmt`, see `envelope::Fmt`): JSON.
#[napi]
pub const FMT_JSON: u32 = Fmt::Json.code();
/// `node:v8` serialization, as base64.
#[napi]
pub const FMT_V8: u32 = Fmt::V8.code();
/// A custom serializer's string.
#[napi]
pub const FMT_TEXT: u32 = Fmt::Text.code();
/// A custom serializer's bytes.
#[napi]
pub const FMT_BYTES: u32 = Fmt::Bytes.code();
