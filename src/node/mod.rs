//! The Node.js binding: the only code that names napi. It converts arguments, finds the engine,
//! and hands results back as small integers; the JS facade (`index.js`) calls loaders, keeps the
//! values at the slots the engine hands out, and turns error codes into `StampedeCacheError`s.
//!
//! Engines live in a per-thread table and are named by a `u32` id, so the hot path (`peek`) needs
//! no handle unwrapping: each worker thread has its own table and its own instances.

use std::cell::RefCell;
use std::rc::Rc;
use std::result::Result;

use napi::bindgen_prelude::*;
use napi::{sys, ValueType};
use napi_derive::napi;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::cache::{Cache, Extra, Hit, Prepared, Step};
use crate::envelope::Envelope;
use crate::error::{Error as CoreError, ErrorCode};
use crate::key;
use crate::policy::{
    self, EntryPolicy, Options, RawOptions, RedisConfig, TlsOptions, TtlOverrides,
};
use crate::store::redis::{RedisTier, Reports};

mod redis;
mod settle;

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

/// One cache instance: the engine, its Redis tier if configured (taken out by `close`), the
/// envelopes (and tags) `set_entry` wrote that `redis_set` sends next (same JS turn), and the
/// results of loads being written back, by flight.
pub struct EngineState {
    cache: Cache,
    redis: Option<Arc<RedisTier>>,
    /// The tier's failures for `onError`, drained after close too.
    reports: Option<Arc<Reports>>,
    written: HashMap<String, (Envelope, Vec<String>)>,
    prepared: HashMap<u64, Option<Prepared>>,
}

impl Drop for EngineState {
    fn drop(&mut self) {
        // A cache collected without close() still stops its bus task.
        if let Some(r) = &self.redis {
            r.close(Vec::new());
        }
    }
}

type Engine = Rc<RefCell<EngineState>>;

thread_local! {
    /// Engines of this thread's JS environment, by id; `None` once finalized (and the id free
    /// for the next engine: a finalized engine's facade is gone, so nothing names it any more).
    static ENGINES: RefCell<Vec<Option<Engine>>> = const { RefCell::new(Vec::new()) };
}

fn engine(id: u32) -> Option<Engine> {
    ENGINES.with_borrow(|v| v.get(id as usize).and_then(|e| e.clone()))
}

/// Runs `f` on engine `id`; a finalized engine behaves as closed.
fn with_engine<R>(
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

/// Reads an optional option of JS type `expected` (`what` names it in the error); undefined is
/// absent, any other type is an invalid option named `label`.
fn typed_option<T: FromNapiValue>(
    obj: &Object,
    name: &str,
    label: &str,
    expected: ValueType,
    what: &str,
) -> Result<Option<T>, JsErr> {
    let fail = |e| napi_fail(ErrorCode::InvalidOption, e);
    let Some(v) = obj.get::<Unknown>(name).map_err(fail)? else {
        return Ok(None);
    };
    match v.get_type().map_err(fail)? {
        ValueType::Undefined => Ok(None),
        t if t == expected => Ok(Some(unsafe { v.cast::<T>() }.map_err(fail)?)),
        other => Err(js_err(CoreError::invalid_option(
            label,
            format!("must be {what}, got {}", type_name(other)),
        ))),
    }
}

fn number_option(obj: &Object, name: &str, label: &str) -> Result<Option<f64>, JsErr> {
    typed_option(obj, name, label, ValueType::Number, "a number")
}

fn string_option(obj: &Object, name: &str) -> Result<Option<String>, JsErr> {
    typed_option(obj, name, name, ValueType::String, "a string")
}

/// PEM text given as a string or a Buffer (`redis.tls.ca`, `.cert`, `.key`).
fn pem_option(obj: &Object, name: &str, label: &str) -> Result<Option<Vec<u8>>, JsErr> {
    let fail = |e| napi_fail(ErrorCode::InvalidOption, e);
    let Some(v) = obj.get::<Unknown>(name).map_err(fail)? else {
        return Ok(None);
    };
    match v.get_type().map_err(fail)? {
        ValueType::Undefined => Ok(None),
        ValueType::String => Ok(Some(
            unsafe { v.cast::<String>() }.map_err(fail)?.into_bytes(),
        )),
        ValueType::Object if v.is_buffer().map_err(fail)? => Ok(Some(
            unsafe { v.cast::<BufferSlice>() }.map_err(fail)?.to_vec(),
        )),
        other => Err(js_err(CoreError::invalid_option(
            label,
            format!(
                "must be PEM text (a string or a Buffer), got {}",
                type_name(other)
            ),
        ))),
    }
}

/// A list of URLs (`redis.cluster`, `redis.sentinels`).
fn urls_option(obj: &Object, name: &str, label: &str) -> Result<Vec<String>, JsErr> {
    let fail = |e| napi_fail(ErrorCode::InvalidOption, e);
    let Some(v) = obj.get::<Unknown>(name).map_err(fail)? else {
        return Ok(Vec::new());
    };
    if v.get_type().map_err(fail)? == ValueType::Undefined {
        return Ok(Vec::new());
    }
    let wrong = || {
        js_err(CoreError::invalid_option(
            label,
            "must be a non-empty array of URL strings",
        ))
    };
    if !v.is_array().map_err(fail)? {
        return Err(wrong());
    }
    let arr = unsafe { v.cast::<Array>() }.map_err(fail)?;
    let mut out = Vec::with_capacity(arr.len() as usize);
    for i in 0..arr.len() {
        let item: Unknown = arr.get(i).map_err(fail)?.ok_or_else(wrong)?;
        if item.get_type().map_err(fail)? != ValueType::String {
            return Err(wrong());
        }
        out.push(unsafe { item.cast::<String>() }.map_err(fail)?);
    }
    if out.is_empty() {
        return Err(wrong());
    }
    Ok(out)
}

/// A timeout of the `redis` option: a positive, finite number of ms.
fn timeout_option(obj: &Object, name: &str, label: &str) -> Result<Option<Duration>, JsErr> {
    match number_option(obj, name, label)? {
        None => Ok(None),
        Some(ms) if ms.is_finite() && ms > 0.0 => Ok(Some(Duration::from_secs_f64(ms / 1_000.0))),
        Some(ms) => Err(js_err(CoreError::invalid_option(
            label,
            format!("must be a positive, finite number of ms, got {ms}"),
        ))),
    }
}

/// The `redis` option: a URL, or `{ url, tls, cluster, sentinels, masterName, connectTimeout,
/// commandTimeout }` (validated as a whole by `Options::validate`).
fn redis_option(obj: &Object) -> Result<Option<RedisConfig>, JsErr> {
    let fail = |e| napi_fail(ErrorCode::InvalidOption, e);
    let Some(v) = obj.get::<Unknown>("redis").map_err(fail)? else {
        return Ok(None);
    };
    match v.get_type().map_err(fail)? {
        ValueType::Undefined => Ok(None),
        ValueType::String => Ok(Some(RedisConfig::from_url(
            &unsafe { v.cast::<String>() }.map_err(fail)?,
        ))),
        ValueType::Object if !v.is_array().map_err(fail)? => {
            let o = unsafe { v.cast::<Object>() }.map_err(fail)?;
            known_names(
                &o,
                &[
                    "url",
                    "tls",
                    "cluster",
                    "sentinels",
                    "masterName",
                    "connectTimeout",
                    "commandTimeout",
                ],
                "redis",
            )?;
            let mut config = RedisConfig::from_url("");
            config.url = typed_option(&o, "url", "redis.url", ValueType::String, "a string")?;
            config.cluster = urls_option(&o, "cluster", "redis.cluster")?;
            config.sentinels = urls_option(&o, "sentinels", "redis.sentinels")?;
            config.master_name = typed_option(
                &o,
                "masterName",
                "redis.masterName",
                ValueType::String,
                "a string",
            )?;
            if let Some(t) = timeout_option(&o, "connectTimeout", "redis.connectTimeout")? {
                config.connect_timeout = t;
            }
            if let Some(t) = timeout_option(&o, "commandTimeout", "redis.commandTimeout")? {
                config.command_timeout = t;
            }
            if let Some(tls) = o.get::<Unknown>("tls").map_err(fail)? {
                match tls.get_type().map_err(fail)? {
                    ValueType::Undefined => {}
                    ValueType::Object if !tls.is_array().map_err(fail)? => {
                        let t = unsafe { tls.cast::<Object>() }.map_err(fail)?;
                        known_names(
                            &t,
                            &["ca", "cert", "key", "servername", "rejectUnauthorized"],
                            "redis.tls",
                        )?;
                        config.tls = Some(TlsOptions {
                            ca: pem_option(&t, "ca", "redis.tls.ca")?,
                            cert: pem_option(&t, "cert", "redis.tls.cert")?,
                            key: pem_option(&t, "key", "redis.tls.key")?,
                            servername: typed_option(
                                &t,
                                "servername",
                                "redis.tls.servername",
                                ValueType::String,
                                "a string",
                            )?,
                            reject_unauthorized: typed_option(
                                &t,
                                "rejectUnauthorized",
                                "redis.tls.rejectUnauthorized",
                                ValueType::Boolean,
                                "a boolean",
                            )?
                            .unwrap_or(true),
                        });
                    }
                    other => {
                        return Err(js_err(CoreError::invalid_option(
                            "redis.tls",
                            format!("must be an object, got {}", type_name(other)),
                        )))
                    }
                }
            }
            Ok(Some(config))
        }
        other => Err(js_err(CoreError::invalid_option(
            "redis",
            format!(
                "must be a URL string or a RedisOptions object, got {}",
                type_name(other)
            ),
        ))),
    }
}

fn type_name(t: ValueType) -> &'static str {
    match t {
        ValueType::Undefined => "undefined",
        ValueType::Null => "null",
        ValueType::Boolean => "a boolean",
        ValueType::Number => "a number",
        ValueType::String => "a string",
        ValueType::Symbol => "a symbol",
        ValueType::Object => "an object",
        ValueType::Function => "a function",
        ValueType::External => "an external",
        ValueType::BigInt => "a bigint",
        _ => "an unknown value",
    }
}

/// Rejects option names the contract does not know, naming the first one.
fn known_names(obj: &Object, allowed: &[&str], what: &str) -> Result<(), JsErr> {
    let names = Object::keys(obj).map_err(|e| napi_fail(ErrorCode::InvalidOption, e))?;
    if let Some(bad) = names.iter().find(|n| !allowed.contains(&n.as_str())) {
        return Err(js_err(CoreError::invalid_option(
            bad,
            format!("is not an option of {what}"),
        )));
    }
    Ok(())
}

fn ttl_overrides(obj: &Object) -> Result<TtlOverrides, JsErr> {
    Ok(TtlOverrides {
        ttl: number_option(obj, "ttl", "ttl")?,
        hard_ttl: number_option(obj, "hardTtl", "hardTtl")?,
        negative_ttl: number_option(obj, "negativeTtl", "negativeTtl")?,
        jitter: number_option(obj, "jitter", "jitter")?,
        beta: number_option(obj, "beta", "beta")?,
        load_timeout: number_option(obj, "loadTimeout", "loadTimeout")?,
    })
}

/// Validates the constructor's options and creates an engine. The facade checks the two
/// function options (`waitUntil`, `onError`), which stay in JS.
#[napi]
pub fn create_engine(options: Option<Object>) -> Result<External<EngineToken>, JsErr> {
    let mut raw = RawOptions::default();
    if let Some(obj) = options.as_ref() {
        known_names(
            obj,
            policy::CONSTRUCTOR_OPTIONS,
            "the StampedeCache constructor",
        )?;
        raw.redis = redis_option(obj)?;
        raw.namespace = string_option(obj, "namespace")?;
        raw.ttls = ttl_overrides(obj)?;
        raw.lock_ttl = number_option(obj, "lockTtl", "lockTtl")?;
        raw.error_backoff = number_option(obj, "errorBackoff", "errorBackoff")?;
        raw.max_refreshes = number_option(obj, "maxConcurrentRefreshes", "maxConcurrentRefreshes")?;
        // The facade turns `{ serialize, deserialize }` into 'custom' (the functions stay in JS).
        raw.serializer = string_option(obj, "serializer")?;
        if let Some(l1) = obj
            .get::<Unknown>("l1")
            .map_err(|e| napi_fail(ErrorCode::InvalidOption, e))?
        {
            match l1
                .get_type()
                .map_err(|e| napi_fail(ErrorCode::InvalidOption, e))?
            {
                ValueType::Undefined => {}
                ValueType::Boolean if !unsafe { l1.cast::<bool>() }.unwrap_or(true) => {
                    raw.l1 = Some(None)
                }
                ValueType::Object
                    if !l1
                        .is_array()
                        .map_err(|e| napi_fail(ErrorCode::InvalidOption, e))? =>
                {
                    let l1obj = unsafe { l1.cast::<Object>() }
                        .map_err(|e| napi_fail(ErrorCode::InvalidOption, e))?;
                    known_names(&l1obj, &["maxEntries", "maxBytes"], "l1")?;
                    let max = number_option(&l1obj, "maxEntries", "l1.maxEntries")?;
                    raw.l1 = Some(Some(max.unwrap_or(policy::DEFAULT_L1_MAX_ENTRIES as f64)));
                    raw.l1_max_bytes = number_option(&l1obj, "maxBytes", "l1.maxBytes")?;
                }
                _ => {
                    return Err(js_err(CoreError::invalid_option(
                        "l1",
                        "must be false or { maxEntries?: number, maxBytes?: number }",
                    )))
                }
            }
        }
    }
    let options = Options::validate(raw).map_err(js_err)?;
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

const MISS: i32 = -1;
/// N-API copies at most `KEY_BUF - 1` bytes and cuts at a character boundary (up to 3 bytes
/// short), so a copy of at most MAX_KEY_BYTES bytes is the whole string: a longer string would
/// have filled at least `KEY_BUF - 4` = MAX_KEY_BYTES + 1 bytes.
const KEY_BUF: usize = key::MAX_KEY_BYTES + 5;

/// The hot path: a usable entry for a string key under the default policy, as `encode_hit`
/// (refresh = 1 asks the facade to start a background refresh), or -1.
///
/// Registered as a raw N-API callback rather than through `#[napi]`: the macro's per-call
/// machinery (argument validation, borrow scopes) cost more than the lookup itself, and this
/// function only reads two primitives and returns an int. The key is read into a stack buffer,
/// so a hit allocates nothing and never converts or copies the cached value.
unsafe extern "C" fn peek_raw(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    let mut argc = 2usize;
    let mut argv = [std::ptr::null_mut(); 2];
    let mut out = std::ptr::null_mut();
    // Not zeroed: N-API writes the bytes it reports, and only those are read.
    let mut buf = std::mem::MaybeUninit::<[u8; KEY_BUF]>::uninit();
    // SAFETY: called by Node on the JS thread with a valid env and callback info; every
    // out-pointer is a live local, and `buf`'s length is passed with it.
    unsafe {
        let mut code = MISS;
        if sys::napi_get_cb_info(
            env,
            info,
            &mut argc,
            argv.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ) == sys::Status::napi_ok
            && argc == 2
        {
            let mut id = 0u32;
            let mut len = 0usize;
            if sys::napi_get_value_uint32(env, argv[0], &mut id) == sys::Status::napi_ok
                && sys::napi_get_value_string_utf8(
                    env,
                    argv[1],
                    buf.as_mut_ptr().cast(),
                    KEY_BUF,
                    &mut len,
                ) == sys::Status::napi_ok
            {
                let written =
                    std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), len.min(KEY_BUF));
                code = peek_key(id, written);
            }
        }
        sys::napi_create_int32(env, code, &mut out);
    }
    out
}

#[inline]
fn peek_key(id: u32, key: &[u8]) -> i32 {
    // Empty or longer than the limit (maybe truncated): never stored, so a miss; the slow path
    // reports the invalid key. U+FFFD may stand for a lone surrogate that UTF-8 cannot carry,
    // which would alias another key: the slow path decides those too.
    if key.is_empty() || key.len() > key::MAX_KEY_BYTES || has_replacement_char(key) {
        return MISS;
    }
    let Ok(key) = std::str::from_utf8(key) else {
        return MISS;
    };
    ENGINES.with_borrow(|engines| {
        let Some(Some(engine)) = engines.get(id as usize) else {
            return MISS;
        };
        let cache = &mut engine.borrow_mut().cache;
        // Invalidations from other processes are applied on the slow path, where the facade
        // reports them to its invalidation channel if anyone listens (once per delivery).
        if cache.inbox().has_pending() {
            return MISS;
        }
        let beta = cache.options().defaults.beta;
        cache.peek(key, beta).map_or(MISS, encode_hit)
    })
}

/// U+FFFD is EF BF BD in UTF-8.
#[inline]
fn has_replacement_char(key: &[u8]) -> bool {
    key.contains(&0xEF) && key.windows(3).any(|w| w == [0xEF, 0xBF, 0xBD])
}

/// Adds `peek(id, key)` to the module's exports. One function for every engine keeps the
/// facade's call site monomorphic (a function per engine made it ~15% slower with 3 caches).
#[napi(module_exports)]
pub fn register_raw_functions(exports: Object, env: Env) -> napi::Result<()> {
    let mut f = std::ptr::null_mut();
    // SAFETY: env and exports come from Node's module initialisation on the JS thread.
    unsafe {
        let name = c"peek";
        napi::check_status!(sys::napi_create_function(
            env.raw(),
            name.as_ptr(),
            4,
            Some(peek_raw),
            std::ptr::null_mut(),
            &mut f
        ))?;
        napi::check_status!(sys::napi_set_named_property(
            env.raw(),
            exports.raw(),
            name.as_ptr(),
            f
        ))?;
    }
    Ok(())
}

/// A hit as one integer: `slot * 8 + kind * 2 + refresh`, kind 0 fresh, 1 stale, 2 negative
/// (the facade reports the kind to its hit channel; the slot is `n >> 3`).
fn encode_hit(hit: Hit) -> i32 {
    let kind = match hit {
        Hit::Fresh { .. } => 0,
        Hit::Stale { .. } => 1,
        Hit::Negative { .. } => 2,
    };
    (hit.slot() as i32) * 8 + kind * 2 + hit.wants_refresh() as i32
}

/// Validates a key and returns its string form (array keys encoded, see `key.rs`).
#[napi]
pub fn encode_key(key: Unknown<'_>) -> Result<String, JsErr> {
    let invalid = |why: &str| js_err(CoreError::new(ErrorCode::InvalidKey, why.to_string()));
    let t = key
        .get_type()
        .map_err(|e| napi_fail(ErrorCode::InvalidKey, e))?;
    match t {
        ValueType::String => {
            let s =
                unsafe { key.cast::<String>() }.map_err(|e| napi_fail(ErrorCode::InvalidKey, e))?;
            key::check(&s).map_err(js_err)?;
            Ok(s)
        }
        ValueType::Object
            if key
                .is_array()
                .map_err(|e| napi_fail(ErrorCode::InvalidKey, e))? =>
        {
            let arr =
                unsafe { key.cast::<Array>() }.map_err(|e| napi_fail(ErrorCode::InvalidKey, e))?;
            let n = arr.len();
            if n as usize > key::MAX_KEY_BYTES {
                return Err(invalid("an array key has too many parts"));
            }
            let mut parts = Vec::with_capacity(n as usize);
            for i in 0..n {
                let part: Unknown = arr
                    .get(i)
                    .map_err(|e| napi_fail(ErrorCode::InvalidKey, e))?
                    .ok_or_else(|| invalid("an array key must not have holes"))?;
                let s = match part
                    .get_type()
                    .map_err(|e| napi_fail(ErrorCode::InvalidKey, e))?
                {
                    ValueType::String => unsafe { part.cast::<String>() },
                    ValueType::Number => {
                        let n = unsafe { part.cast::<f64>() }
                            .map_err(|e| napi_fail(ErrorCode::InvalidKey, e))?;
                        if !n.is_finite() {
                            return Err(invalid(
                                "array key parts must be strings or finite numbers",
                            ));
                        }
                        // JS's own number-to-string, so `[1e21]` reads as `1e+21` as in JS.
                        part.coerce_to_string()
                            .and_then(|s| s.into_utf8())
                            .and_then(|s| s.into_owned())
                    }
                    other => {
                        return Err(invalid(&format!(
                            "array key parts must be strings or finite numbers, got {}",
                            type_name(other)
                        )))
                    }
                }
                .map_err(|e| napi_fail(ErrorCode::InvalidKey, e))?;
                parts.push(s);
            }
            key::encode_parts(&parts).map_err(js_err)
        }
        other => Err(invalid(&format!(
            "a key must be a non-empty string or an array of strings and finite numbers, got {}",
            type_name(other)
        ))),
    }
}

/// Validates a call's options (`getOrLoad` or `set`) and returns the policy its entry is written
/// with: `[ttl, hardTtl, negativeTtl, jitter, beta, loadTimeout]`.
#[napi]
pub fn resolve_policy(id: u32, options: Object, for_set: bool) -> Result<Vec<f64>, JsErr> {
    let (allowed, what) = if for_set {
        (policy::SET_OPTIONS, "set")
    } else {
        (policy::CALL_OPTIONS, "getOrLoad")
    };
    known_names(&options, allowed, what)?;
    let overrides = ttl_overrides(&options)?;
    with_engine(id, |c| c.cache.options().resolve(&overrides)).map(|p| policy_vec(&p))
}

fn policy_vec(p: &EntryPolicy) -> Vec<f64> {
    vec![
        p.ttl,
        p.hard_ttl,
        p.negative_ttl,
        p.jitter,
        p.beta,
        p.load_timeout,
    ]
}

fn policy_of(c: &EngineState, p: Option<&[f64]>) -> EntryPolicy {
    match p {
        Some([ttl, hard_ttl, negative_ttl, jitter, beta, load_timeout, ..]) => EntryPolicy {
            ttl: *ttl,
            hard_ttl: *hard_ttl,
            negative_ttl: *negative_ttl,
            jitter: *jitter,
            beta: *beta,
            load_timeout: *load_timeout,
        },
        _ => c.cache.options().defaults,
    }
}

/// The constructor's policy, as `resolve_policy` returns a call's (the facade reads its
/// loadTimeout for calls without options).
#[napi]
pub fn default_policy(id: u32) -> Vec<f64> {
    engine(id)
        .map(|e| policy_vec(&e.borrow().cache.options().defaults))
        .unwrap_or_default()
}

pub const STEP_SERVE: u32 = 0;
pub const STEP_LEAD: u32 = 1;
pub const STEP_JOIN: u32 = 2;

/// `kind` 0: serve `n` (see `encode_hit`); 1: lead flight `n`; 2: join flight `n`.
#[napi(object)]
pub struct LookupStep {
    pub kind: u32,
    pub n: f64,
}

#[napi]
pub fn lookup(
    id: u32,
    key: String,
    policy: Option<Vec<f64>>,
    force: bool,
) -> Result<LookupStep, JsErr> {
    with_engine(id, |c| {
        let beta = policy_of(c, policy.as_deref()).beta;
        Ok(match c.cache.lookup(&key, beta, force)? {
            Step::Serve(hit) => LookupStep {
                kind: STEP_SERVE,
                n: encode_hit(hit) as f64,
            },
            Step::Lead(f) => LookupStep {
                kind: STEP_LEAD,
                n: f as f64,
            },
            Step::Join(f) => LookupStep {
                kind: STEP_JOIN,
                n: f as f64,
            },
        })
    })
}

/// Registers the background refresh a hit asked for: its flight id, or -1 if one already runs.
#[napi]
pub fn begin_refresh(id: u32, key: String) -> f64 {
    with_engine(id, |c| {
        Ok(c.cache.begin_refresh(&key).map_or(-1.0, |f| f as f64))
    })
    .unwrap_or(-1.0)
}

/// The loader of `flight` returned (a cache without Redis; with Redis, `write_back` then
/// `finish_write`): the slot to keep the value at, -1 when the in-process tier keeps nothing,
/// -2 when the flight was superseded (its result is written nowhere). `tags`: the result's;
/// `inherit` (a refresh): none given keeps the replaced entry's. `size`: serialized bytes.
#[napi]
pub fn complete(
    id: u32,
    key: String,
    flight: f64,
    compute_ms: f64,
    negative: bool,
    policy: Option<Vec<f64>>,
    tags: Option<Vec<String>>,
    inherit: bool,
    size: f64,
) -> i32 {
    with_engine(id, |e| {
        let p = policy_of(e, policy.as_deref());
        let extra = Extra {
            tags: tags.unwrap_or_default(),
            size: size as u64,
        };
        Ok(
            match e.cache.complete(
                &key,
                flight as u64,
                compute_ms,
                negative,
                &p,
                extra,
                inherit,
            ) {
                None => -2,
                Some(w) => w.slot.map_or(-1, |s| s as i32),
            },
        )
    })
    .unwrap_or(-2)
}

/// The loader of `flight` is about to run.
#[napi]
pub fn note_loader_call(id: u32, key: String, flight: f64) {
    let _ = with_engine(id, |e| {
        e.cache.note_loader_call(&key, flight as u64);
        Ok(())
    });
}

/// The loader of `flight` declined caching (`ctx.skipCache()`): the flight ends, nothing is
/// written anywhere.
#[napi]
pub fn skip(id: u32, key: String, flight: f64) {
    let _ = with_engine(id, |c| {
        c.cache.skip(&key, flight as u64);
        Ok(())
    });
}

/// Slots whose values the facade should drop (freed under `l1.maxBytes`); take them before
/// keeping a value at a slot just handed out.
#[napi]
pub fn take_released(id: u32) -> Vec<u32> {
    engine(id)
        .map(|e| e.borrow_mut().cache.take_released())
        .unwrap_or_default()
}

/// The loader of `flight` failed. For a background refresh, returns its retry-after (epoch
/// ms) to record in Redis; else 0.
#[napi]
pub fn fail(id: u32, key: String, flight: f64) -> f64 {
    with_engine(id, |c| Ok(c.cache.fail(&key, flight as u64).unwrap_or(0.0))).unwrap_or(0.0)
}

/// Writes a value given to `set`: its slot, -1 when the in-process tier keeps nothing, -2 when a
/// zero TTL caches nothing at all.
#[napi]
pub fn set_entry(
    id: u32,
    key: String,
    negative: bool,
    policy: Option<Vec<f64>>,
    tags: Option<Vec<String>>,
    size: f64,
) -> Result<i32, JsErr> {
    with_engine(id, |e| {
        let p = policy_of(e, policy.as_deref());
        let extra = Extra {
            tags: tags.unwrap_or_default(),
            size: size as u64,
        };
        Ok(match e.cache.set(&key, negative, &p, &extra)? {
            // A zero TTL keeps nothing here; the facade deletes any older copy in Redis.
            None => -2,
            Some(w) => {
                if e.redis.is_some() {
                    e.written.insert(key, (w.envelope, extra.tags));
                }
                w.slot.map_or(-1, |s| s as i32)
            }
        })
    })
}

/// `[freedSlot or -1, 1 if a live entry was removed else 0]`.
#[napi]
pub fn delete_entry(id: u32, key: String) -> Result<Vec<i32>, JsErr> {
    with_engine(id, |c| {
        let (slot, removed) = c.cache.delete(&key)?;
        Ok(vec![slot.map_or(-1, |s| s as i32), removed as i32])
    })
}

/// A fresh, stale or negative entry as `encode_hit` (never loads, never refreshes), or -1.
/// With Redis, a miss here is counted by the Redis read that follows.
#[napi]
pub fn get_entry(id: u32, key: String) -> Result<i32, JsErr> {
    with_engine(id, |c| {
        let count_miss = c.redis.is_none();
        Ok(c.cache.get_hit(&key, count_miss)?.map_or(MISS, encode_hit))
    })
}

/// Starts or stops keeping the invalidations applied from other processes for
/// `take_invalidations` (the facade turns it on while its invalidation channel has listeners).
#[napi]
pub fn observe_invalidations(id: u32, on: bool) {
    if let Some(e) = engine(id) {
        e.borrow_mut().cache.observe_invalidations(on);
    }
}

/// The keys dropped because other processes changed them, in the order applied, since the last
/// call; `null` stands for everything (the bus reconnected, or too many to remember).
#[napi]
pub fn take_invalidations(id: u32) -> Vec<Option<String>> {
    engine(id)
        .map(|e| e.borrow_mut().cache.take_applied())
        .unwrap_or_default()
        .into_iter()
        .map(|k| k.map(String::from))
        .collect()
}

#[napi(object)]
pub struct EntryInfo {
    pub state: String,
    pub fresh_until: f64,
    pub hard_until: f64,
    pub compute_ms: f64,
}

#[napi]
pub fn inspect_entry(id: u32, key: String) -> Result<Option<EntryInfo>, JsErr> {
    with_engine(id, |c| {
        Ok(c.cache.inspect(&key)?.map(|i| EntryInfo {
            state: i.state.as_str().to_string(),
            fresh_until: i.fresh_until,
            hard_until: i.hard_until,
            compute_ms: i.compute_ms,
        }))
    })
}

#[napi(object)]
pub struct Stats {
    pub hits: f64,
    pub stale_hits: f64,
    pub misses: f64,
    pub loads: f64,
    pub coalesced: f64,
    pub refreshes: f64,
    pub refresh_errors: f64,
    pub negative_hits: f64,
    pub lock_wins: f64,
    pub lock_waits: f64,
    pub redis_errors: f64,
    pub l2_hits: f64,
    pub l1_entries: f64,
    pub l1_bytes: f64,
}

/// Counters since construction (still readable after `close`).
#[napi]
pub fn stats(id: u32) -> Stats {
    let (s, (entries, bytes)) = engine(id)
        .map(|e| {
            let e = e.borrow();
            (e.cache.stats.snapshot(), e.cache.l1_usage())
        })
        .unwrap_or_default();
    Stats {
        hits: s.hits as f64,
        stale_hits: s.stale_hits as f64,
        misses: s.misses as f64,
        loads: s.loads as f64,
        coalesced: s.coalesced as f64,
        refreshes: s.refreshes as f64,
        refresh_errors: s.refresh_errors as f64,
        negative_hits: s.negative_hits as f64,
        lock_wins: s.lock_wins as f64,
        lock_waits: s.lock_waits as f64,
        redis_errors: s.redis_errors as f64,
        l2_hits: s.l2_hits as f64,
        l1_entries: entries as f64,
        l1_bytes: bytes as f64,
    }
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

/// Internal counts for tests: `[flights in progress, entries, lock-waiter keys, unsent writes,
/// inbox keys, applied invalidations kept for the facade and not yet taken]`.
#[napi]
pub fn debug_counts(id: u32) -> Vec<u32> {
    engine(id)
        .map(|e| {
            let c = e.borrow();
            let waiting = c.redis.as_ref().map_or(0, |r| r.waiting_keys());
            let unsent = c.redis.as_ref().map_or(0, |r| r.pending_writes());
            vec![
                c.cache.flights_in_progress() as u32,
                c.cache.entries() as u32,
                waiting as u32,
                (c.written.len() + c.prepared.len() + unsent) as u32,
                c.cache.inbox().pending_keys() as u32,
                c.cache.applied_kept() as u32,
                c.cache.refreshes_running() as u32,
            ]
        })
        .unwrap_or_else(|| vec![0; 7])
}

/// The slot of a live entry without counting a read (for `ctx.stale` on forceRefresh), or -1.
#[napi]
pub fn current_slot(id: u32, key: String) -> i32 {
    engine(id)
        .and_then(|e| e.borrow_mut().cache.live_slot(&key))
        .map_or(-1, |s| s as i32)
}
