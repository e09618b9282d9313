//! The Node.js binding: the only code that names napi. It converts arguments, finds the engine,
//! and hands results back as small integers; the JS facade (`lib/cache.js`) calls loaders, keeps the
//! values at the slots the engine hands out, and turns error codes into `StampedeCacheError`s.
//!
//! Engines live in a per-thread table and are named by a `u32` id, so the hot path (`peek`) needs
//! no handle unwrapping: each worker thread has its own table and its own instances.
//!
//! By concern: `engines` (the table), `lifecycle` (creating and closing an engine), `options`
//! (what is read from JS values: options, policies, keys, a loader's result), `hot_path`
//! (`peek`, `freshIndex`: the engine's words shared with the facade's index of fresh entries,
//! and every `unsafe` block but `settle`'s and `lane`'s), `local` (the in-process
//! operations), `redis` (the Redis operations), `reads` (the Redis reads behind them: gates,
//! fetches, a lane read's answer), `flight` (a flight's record from its gate to its end),
//! `answer` (what a Redis read answers JS), `batch` (many keys at once), `codes` (the numbers
//! the facade and the binding agree on, exported to JS), `settle` (the one threadsafe function
//! per JS thread that Redis promises settle through, in batches; its raw N-API calls), `lane`
//! (the read lane's socket, driven by the JS thread's libuv loop; its raw libuv calls).
//!
//! Imports run one way, from the calls JS makes down to what they share: `batch` -> `redis`
//! (a batch's keys are adopted as `adopt` adopts one), `local`, `lifecycle` -> `reads` ->
//! `answer`, `options`, `hot_path` -> `engines` -> `flight`, `lane` -> `settle`, `codes`. A module names none above it (`lane` settles a read through the
//! function its asker gives, `lane::Then`).
//!
//! # Boundary rules
//!
//! What the facade and the binding each rely on the other for. Where code can enforce a rule,
//! the rule says where it does.
//!
//! 1. **Every flight ends exactly once**, with one of: `complete` (no Redis), `writeBack` then
//!    `finishWrite` (Redis), `adopt` (Redis had the entry), `abandon` (another process holds the
//!    refresh), `fail` (the loader threw or timed out, or its value could not be serialized), or
//!    `skip` (`ctx.skipCache()`). Each end takes the flight from the engine only if it is still
//!    the key's (`Singleflight::take`), so a superseded flight's end writes nothing, and the
//!    facade drops the flight's promise (`flights`, lib/core.js) at the same point. The tests'
//!    `assertNoLeaks`/`assertIdle` check that no flight outlives its load (`_debugCounts()`).
//! 2. **`redisWrite` runs in the JS turn of the `setEntry` that filled `written`**, before any
//!    `await` and before any user code (a channel subscriber) can run: it sends the envelope that
//!    call wrote, and queues it behind this instance's earlier writes of the key, so Redis sees
//!    writes in call order. `redisWrite` takes the key's entry out of `written`; one left over is
//!    an unsent write (`_debugCounts().unsentWrites`, 0 when idle in the tests). A flight that
//!    passed a Redis gate has a record (`flight.rs`) until its end takes it: its ticket (lock,
//!    fence, born, stamp), what its gate found, and `writeBack`'s prepared entry, which the
//!    `finishWrite` of the same flight takes (by flight id, after the await). Records count as
//!    unsent writes too; a record dropped any other way (close) releases its lock.
//! 3. **A slot is filled before the next `await`**: after a call answers a slot (`complete`,
//!    `finishWrite`, `adopt`, `adoptMany`, `setEntry`, `deleteEntry`'s freed slot), the facade
//!    stores the value there (or drops it) in the same JS turn, since the engine may hand the
//!    slot to another key at its next call, and a hit there (the hot path is synchronous) reads
//!    whatever the slot holds. In `lib/core.js`, `fill(slot, value)` (`fillMany` for a
//!    batch's slots) is the one place that stores a value at a slot, and each call that answers
//!    a slot is its argument (or the statement before it).
//!    Under `l1.maxBytes`, `fill` first drops the values at the slots `takeReleased` lists.
//! 4. **Codes cross as numbers the binding exports** (`codes.rs`); the facade reads them once,
//!    at load, and declares none itself.
//! 5. **Errors cross as `napi::Error` whose status is the stable `ERR_*` code** (`js_err`); the
//!    facade rewraps them as `StampedeCacheError`s. Loader errors never cross.

// Every unsafe block here says why it is sound: checked, not only by habit.
#![deny(clippy::undocumented_unsafe_blocks)]

use crate::error::{Error as CoreError, ErrorCode};

mod answer;
mod batch;
mod codes;
mod engines;
mod flight;
mod hot_path;
mod lane;
mod lifecycle;
mod local;
mod options;
mod reads;
mod redis;
mod settle;

impl AsRef<str> for ErrorCode {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// Errors reach JS with `code` set to the stable code; the facade rewraps them. (Exported
/// functions spell `Result<T, JsErr>` out: napi-derive recognizes a `Result` return by name.)
type JsErr = napi::Error<ErrorCode>;

fn js_err(e: CoreError) -> JsErr {
    napi::Error::new(e.code, e.message)
}

fn napi_fail(code: ErrorCode, e: napi::Error) -> JsErr {
    napi::Error::new(code, e.reason)
}
