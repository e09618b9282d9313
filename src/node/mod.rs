//! The Node.js binding: the only code that names napi. It converts arguments, finds the engine,
//! and hands results back as small integers; the JS facade (`index.js`) calls loaders, keeps the
//! values at the slots the engine hands out, and turns error codes into `StampedeCacheError`s.
//!
//! Engines live in a per-thread table and are named by a `u32` id, so the hot path (`peek`) needs
//! no handle unwrapping: each worker thread has its own table and its own instances.
//!
//! By concern: `engines` (the table, creating and closing an engine), `options` (what is read
//! from JS values: options, policies, keys), `hot_path` (`peek`, the raw N-API code),
//! `local` (the in-process operations), `redis` (the Redis operations).

use crate::error::{Error as CoreError, ErrorCode};

mod codes;
mod engines;
mod hot_path;
mod local;
mod options;
mod redis;

impl AsRef<str> for ErrorCode {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// Errors reach JS with `code` set to the stable code; the facade rewraps them. (Exported
/// functions spell `Result<T, JsError>` out: napi-derive recognizes a `Result` return by name.)
type JsErr = napi::Error<ErrorCode>;

fn js_err(e: CoreError) -> JsErr {
    napi::Error::new(e.code, e.message)
}

fn napi_fail(code: ErrorCode, e: napi::Error) -> JsErr {
    napi::Error::new(code, e.reason)
}
