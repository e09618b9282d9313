//! stampede-cache: the Rust core of a cache that stops cache stampedes, and its Node.js binding.
//!
//! Every module but `node` is plain Rust (no napi), so `cargo test --no-default-features` tests
//! the core without Node.

pub mod cache;
pub mod clock;
pub mod envelope;
pub mod error;
pub mod inbox;
pub mod jitter;
pub mod key;
pub mod policy;
pub mod singleflight;
pub mod stats;
pub mod store;
pub mod xfetch;

// Not in `cargo test` builds: napi-derive registers exports only outside tests, and the binding
// is tested from JavaScript (__test__/).
#[cfg(all(feature = "node", not(test)))]
mod node;
