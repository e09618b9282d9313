//! The per-thread engine table: an engine per cache instance, named by a `u32` id, created from
//! the constructor's options and closed by `close`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::result::Result;
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use super::lane::LaneSlot;
use super::options::engine_options;
use super::{js_err, JsErr};
use crate::cache::{Cache, Prepared};
use crate::envelope::Envelope;
use crate::error::{Error as CoreError, ErrorCode};
use crate::store::redis::{RedisTier, Reports};

/// One cache instance: the engine, its Redis tier if configured (taken out by `close`), the
/// envelopes (and tags) `set_entry` wrote that `redis_write` sends next (same JS turn, see
/// "Boundary rules" in `mod.rs`), and the results of loads being written back, by flight.
pub struct EngineState {
    pub(super) cache: Cache,
    pub(super) redis: Option<Arc<RedisTier>>,
    /// The tier's failures for `onError`, drained after close too.
    pub(super) reports: Option<Arc<Reports>>,
    pub(super) written: HashMap<String, (Envelope, Vec<String>)>,
    pub(super) prepared: HashMap<u64, Option<Prepared>>,
    /// The read lane to the tier's server, if any (see `lane.rs`).
    pub(super) lane: LaneSlot,
}

impl Drop for EngineState {
    fn drop(&mut self) {
        // A cache collected without close() still closes its lane and stops its bus task.
        self.lane.close();
        if let Some(r) = &self.redis {
            r.close(Vec::new());
        }
    }
}

pub(super) type Engine = Rc<RefCell<EngineState>>;

thread_local! {
    /// Engines of this thread's JS environment, by id; `None` once finalized (and the id free
    /// for the next engine: a finalized engine's facade is gone, so nothing names it any more).
    pub(super) static ENGINES: RefCell<Vec<Option<Engine>>> = const { RefCell::new(Vec::new()) };
}

pub(super) fn engine(id: u32) -> Option<Engine> {
    ENGINES.with_borrow(|v| v.get(id as usize).and_then(|e| e.clone()))
}

/// Runs `f` on engine `id`; a finalized engine behaves as closed.
pub(super) fn with_engine<R>(
    id: u32,
    f: impl FnOnce(&mut EngineState) -> Result<R, CoreError>,
) -> Result<R, JsErr> {
    let Some(e) = engine(id) else {
        return Err(js_err(CoreError::new(
            ErrorCode::Closed,
            "the cache is closed",
        )));
    };
    let mut cache = e.borrow_mut();
    f(&mut cache).map_err(js_err)
}

/// Owned by the JS facade; when it is garbage-collected the engine goes with it.
pub struct EngineToken(u32);

impl Drop for EngineToken {
    fn drop(&mut self) {
        let id = self.0 as usize;
        // The table may already be gone while the thread shuts down.
        let _ = ENGINES.try_with(|v| {
            if let Ok(mut v) = v.try_borrow_mut() {
                if let Some(slot) = v.get_mut(id) {
                    *slot = None;
                }
            }
        });
    }
}
/// Validates the constructor's options and creates an engine. The facade checks the two
/// function options (`waitUntil`, `onError`), which stay in JS.
#[napi]
pub fn create_engine(options: Option<Object>) -> Result<External<EngineToken>, JsErr> {
    let options = engine_options(options.as_ref())?;
    let cache = Cache::new(options);
    let redis = match cache.options().redis.as_ref() {
        None => None,
        Some(config) => {
            let runtime =
                napi::bindgen_prelude::within_runtime_if_available(tokio::runtime::Handle::current);
            let tier = RedisTier::new(
                config,
                &cache.options().namespace,
                cache.stats.clone(),
                cache.inbox().clone(),
                runtime,
                cache.options().serializer,
                cache.options().tag_ttl as u64,
            )
            .map_err(|why| {
                js_err(CoreError::invalid_option(
                    "redis",
                    format!("is not usable: {why}"),
                ))
            })?;
            let connecting = tier.clone();
            napi::bindgen_prelude::spawn(async move { connecting.connect().await });
            napi::bindgen_prelude::spawn(tier.clone().run_bus());
            Some(tier)
        }
    };
    let cache = Rc::new(RefCell::new(EngineState {
        cache,
        reports: redis.as_ref().map(|r| r.reports()),
        redis,
        written: HashMap::new(),
        prepared: HashMap::new(),
        lane: LaneSlot::default(),
    }));
    let id = ENGINES.with_borrow_mut(|v| match v.iter().position(Option::is_none) {
        Some(free) => {
            v[free] = Some(cache);
            free as u32
        }
        None => {
            v.push(Some(cache));
            (v.len() - 1) as u32
        }
    });
    Ok(External::new(EngineToken(id)))
}

#[napi]
pub fn engine_id(token: &External<EngineToken>) -> u32 {
    token.0
}

/// Closes the engine. `held` are `[key, token]` of the Redis locks that loads still running
/// hold: they are released now, in one go, on the tier's connection, which then closes (a load
/// that ends later writes nothing and needs no connection).
#[napi]
pub fn close_engine(id: u32, held: Option<Vec<Vec<String>>>) {
    if let Some(e) = engine(id) {
        let mut e = e.borrow_mut();
        e.cache.close();
        e.written.clear();
        e.prepared.clear();
        e.lane.close();
        if let Some(r) = e.redis.take() {
            let held = held
                .unwrap_or_default()
                .into_iter()
                .filter_map(|pair| match <[String; 2]>::try_from(pair) {
                    Ok([key, token]) => Some((key, token)),
                    Err(_) => None,
                })
                .collect();
            r.close(held);
        }
    }
}
