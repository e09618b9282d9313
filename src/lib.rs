//! stampede-cache: the Rust core of a cache that stops cache stampedes, and its Node.js binding.
//!
//! Every module but `node` is plain Rust (no napi), so `cargo test --no-default-features` tests
//! the core without Node. The public contract is `docs/CONTRACT.md`.
//!
//! ## Terminology
//!
//! Words this code uses in a sense of its own, roughly in the order a call meets them.
//!
//! * **Engine**: one cache instance's Rust side, a [`cache::Cache`] and its Redis tier, named by
//!   a `u32` id in the binding's per-thread table. **Facade**: the JS class over it (`lib/cache.js`),
//!   which does what only JS can (call loaders, await, keep values).
//! * **Tier**: a place entries live: the *in-process tier* (`l1`, [`store::memory`]) and the
//!   *Redis tier* (`l2`, [`store::redis`]). `store/` is the module that implements the tiers;
//!   "tier" names the role.
//! * **Envelope** ([`envelope::Envelope`]): what the engine keeps about an entry besides its
//!   value: fresh-until and hard-until times, compute time, negative or not, retry-after, and
//!   born-at. In Redis it travels as JSON with the value, the tags and the value's format.
//!   **Fresh** before fresh-until, **stale** until hard-until (served at once while one caller
//!   refreshes), **expired** after. A **negative** entry caches a not-found (`null`/`undefined`).
//! * **Slot**: the dense integer the in-process store hands out per entry; the facade keeps the
//!   value at that index of an array, so a hit returns a number and never copies the value.
//!   Slots are reused. **Released** slots: ones freed under `l1.maxBytes` whose values the
//!   facade must drop.
//! * **Hit encoding**: a hit as one integer (slot, kind, refresh bit), see `node/codes.rs`.
//!   **Codes**: the numbers the facade and the binding agree on, all exported from there.
//! * **Plain** entry: neither negative nor tagged; the hot path proves it fresh with one compare
//!   against the clock ([`clock`]).
//! * **Flight** ([`singleflight`]): one load in progress for a key, named by a `FlightId`; a
//!   `Load` (a miss or `forceRefresh`) or a `Refresh` (background). The first caller **leads**
//!   it (calls the loader), later callers **join** it (await the leader's promise; `coalesced`).
//!   A `set`, `delete` or `clear` **supersedes** the key's flight: it ends, and its result is
//!   written nowhere. A flight ends exactly once (see "Boundary rules" in `node/mod.rs`).
//! * **Purpose**: why a flight runs: cold (a miss), refresh, force (`forceRefresh`), or past
//!   value (a cold load past a Redis value this cache's serializer cannot read).
//! * **XFetch** ([`xfetch`]): probabilistic early refresh of a fresh entry, more likely near
//!   expiry and for slow loads; the **horizon** is how far from expiry a draw can reach.
//! * **Backoff** (`retry_after`): after a failed refresh, no refresh of the key starts before
//!   `errorBackoff` has passed; the stale value keeps being served.
//! * **Gate** ([`store::redis::Gate`]): what a flight asks Redis before it loads: **found** (use
//!   the entry Redis has), **lead** (call the loader, with the **lock** if it won it), **skip**
//!   (another process holds the refresh), **closed**. The lock (`<ns>:lock:{key}`) saves
//!   loads; its **token** names the holder; a **lock outcome** says how a bid ended (won,
//!   waited, took over, gave up, skipped).
//! * **Generation / fence**: every write gives the envelope a fresh **generation** (in its
//!   header); a load reads the key's generation at its gate (a key with no value gets a
//!   **marker**, a header without a value, so there is one), its **fence**, and its
//!   **write-back** (the result written to Redis before any caller sees it) is dropped if the
//!   generation changed meanwhile (a `delete` removes the value or marker: an absent key matches
//!   no fence). The lock saves work; the fence is
//!   what keeps an older value from winning.
//! * **Adopt**: take an envelope found in Redis into the in-process tier, ending the flight that
//!   asked. **Abandon**: end a flight without writing, because another process holds the
//!   refresh; local refreshes of the key are held back meanwhile (until it announces its result,
//!   at most a second).
//! * **Bus**: the pub/sub channel `<ns>:bus:<db>`. An **announcement** (`<origin> <key>`) drops
//!   other processes' in-process copies of the key and wakes its lock waiters.
//! * **Inbox** ([`inbox`]): what other threads (the bus) tell the cache: keys to drop, and
//!   whether stale copies may be trusted; applied on the cache's thread at its next call.
//!   **Stamp**: a key's invalidation sequence number, taken before a Redis read is sent; a read
//!   whose key's stamp changed meanwhile (an invalidation, or a write here) is not kept.
//! * **Fresh index** ([`fresh`]): the facade's own map of entries the engine proved fresh, so
//!   such a hit makes no native call; the engine offers an entry with the time until which no
//!   decision can be due (**until**), and voids every offer by bumping the **epoch** on any
//!   change that could make one wrong. The **touch log** carries the hits it served back to the
//!   LRU.
//! * **Trust-stale**: whether stale in-process copies may be served; off while the bus is down
//!   but Redis answers (invalidations may be missed), so stale copies are re-read from Redis.
//! * **Namespace clock / born / dead**: a counter every `deleteByTag` and `clear` advances. An
//!   entry is **born** at the clock its load began at (or its `set` was made at); one born
//!   before a `clear`, or before a `deleteByTag` of one of its tags (by **tag bucket**, a hash
//!   of the tag), is **dead** wherever it is read. **Tentative**: such a deletion applied here
//!   before Redis took it, put back if Redis cannot take it. **Sweep**: `clear`'s SCAN that
//!   deletes the dead entries from Redis afterwards. **Stale** (tag-expired): born before an
//!   `expireByTag` of one of its tags (the clock advances for it too), an entry is served stale
//!   and refreshed rather than dead; `expire(key)` ends one entry's freshness in place.
//! * **Write order** ([`store::redis::WriteOrder`]): one instance's Redis writes run in call
//!   order per key; a namespace-wide write (`deleteByTag`, `clear`) is ordered against all.
//! * **Probe**: after a Redis failure the tier is skipped at once, and one background probe at a
//!   time tries Redis again. **Reports**: Redis failures queued for `onError`, rate-limited.

pub mod cache;
pub mod clock;
pub mod envelope;
pub mod error;
pub mod fresh;
pub mod inbox;
pub mod jitter;
pub mod json_element;
pub mod key;
pub mod policy;
pub mod redis_parts;
pub mod singleflight;
pub mod stats;
pub mod store;
pub mod sync;
pub mod xfetch;

// Not in `cargo test` builds: napi-derive registers exports only outside tests, and the binding
// is tested from JavaScript (__test__/).
#[cfg(all(feature = "node", not(test)))]
mod node;
