//! Creating and closing an engine (the table is `engines.rs`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::result::Result;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use super::engines::{engine, EngineState, EngineToken, ENGINES};
use super::lane::{LaneSlot, NodeLanes};
use super::options::engine_options;
use super::{js_err, JsErr};
use crate::cache::Cache;
use crate::error::Error as CoreError;
use crate::store::redis::{Policies, RedisTier};

/// Validates the constructor's options and creates an engine. The facade checks the two
/// function options (`waitUntil`, `onError`), which stay in JS.
#[napi]
pub fn create_engine(options: Option<Object>) -> Result<External<EngineToken>, JsErr> {
    let options = engine_options(options.as_ref())?;
    let mut cache = Cache::new(options);
    let redis = match cache.options().redis.as_ref() {
        None => None,
        Some(config) => {
            let runtime =
                napi::bindgen_prelude::within_runtime_if_available(tokio::runtime::Handle::current);
            let policies = Policies {
                namespace: cache.options().namespace.clone(),
                serializer: cache.options().serializer,
                lock_ttl_ms: cache.options().lock_ttl as u64,
                tag_ttl_ms: cache.options().tag_ttl as u64,
            };
            let tier = RedisTier::new(
                config,
                policies,
                cache.stats.clone(),
                cache.inbox().clone(),
                runtime,
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
            // After a lost bus connection, the copies held here are checked against Redis.
            let checking = std::sync::Arc::downgrade(&tier);
            cache.set_verifier(Box::new(move |held| {
                if let Some(tier) = checking.upgrade() {
                    napi::bindgen_prelude::spawn(async move { tier.verify_held(held).await });
                }
            }));
            Some(tier)
        }
    };
    let cache = Rc::new(RefCell::new(EngineState {
        cache,
        reports: redis.as_ref().map(|r| r.reports()),
        redis,
        written: HashMap::new(),
        expected: HashMap::new(),
        flights: HashMap::new(),
        lane: LaneSlot::default(),
        node_lanes: NodeLanes::default(),
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

/// Closes the engine. The Redis locks that loads still running hold are released now, as their
/// flights' records drop, in one go on the tier's connection, which then closes (a load that
/// ends later writes nothing and needs no connection).
#[napi]
pub fn close_engine(id: u32) {
    let Some(e) = engine(id) else { return };
    let flights = {
        let mut e = e.borrow_mut();
        e.cache.close();
        e.written.clear();
        e.expected.clear();
        e.lane.close();
        e.node_lanes.close();
        if let Some(r) = e.redis.take() {
            r.close();
        }
        std::mem::take(&mut e.flights)
    };
    drop(flights);
}
