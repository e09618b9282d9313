//! What the binding reads from JS values: the constructor's options (the `redis` option
//! included), a call's options and the policy they resolve to, and keys.

use std::result::Result;
use std::time::Duration;

use napi::bindgen_prelude::*;
use napi::ValueType;
use napi_derive::napi;

use super::codes::{
    POLICY_BETA, POLICY_FIELDS, POLICY_HARD_TTL, POLICY_JITTER, POLICY_LOAD_TIMEOUT,
    POLICY_NEGATIVE_TTL, POLICY_TTL,
};
use super::engines::{engine, with_engine, EngineState};
use super::hot_path::checked_cast;
use super::{js_err, napi_fail, JsErr};
use crate::cache::{Extra, Loaded};
use crate::error::{Error as CoreError, ErrorCode};
use crate::key;
use crate::policy::{
    self, EntryPolicy, Options, RawOptions, RedisConfig, RedisParts, TlsOptions, TtlOverrides,
};

/// Reads an optional option of JS type `expected` (`what` names it in the error); undefined is
/// absent, any other type is an invalid option named `label`.
fn typed_option<T: FromNapiValue + ValidateNapiValue>(
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
        t if t == expected => Ok(Some(checked_cast::<T>(&v).map_err(fail)?)),
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
        ValueType::String => Ok(Some(checked_cast::<String>(&v).map_err(fail)?.into_bytes())),
        ValueType::Object if v.is_buffer().map_err(fail)? => Ok(Some(
            checked_cast::<BufferSlice>(&v).map_err(fail)?.to_vec(),
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
    let arr = checked_cast::<Array>(&v).map_err(fail)?;
    let mut out = Vec::with_capacity(arr.len() as usize);
    for i in 0..arr.len() {
        let item: Unknown = arr.get(i).map_err(fail)?.ok_or_else(wrong)?;
        if item.get_type().map_err(fail)? != ValueType::String {
            return Err(wrong());
        }
        out.push(checked_cast::<String>(&item).map_err(fail)?);
    }
    if out.is_empty() {
        return Err(wrong());
    }
    Ok(out)
}

/// A timeout of the `redis` option (see `policy::redis_timeout`).
fn timeout_option(obj: &Object, name: &str, label: &str) -> Result<Option<Duration>, JsErr> {
    match number_option(obj, name, label)? {
        None => Ok(None),
        Some(ms) => policy::redis_timeout(label, ms).map(Some).map_err(js_err),
    }
}

/// The `redis` option: a URL, or `{ url, host, port, path, username, password, db, tls, cluster,
/// sentinels, masterName, connectTimeout, commandTimeout }` (validated as a whole by `Options::validate`).
fn redis_option(obj: &Object) -> Result<Option<RedisConfig>, JsErr> {
    let fail = |e| napi_fail(ErrorCode::InvalidOption, e);
    let Some(v) = obj.get::<Unknown>("redis").map_err(fail)? else {
        return Ok(None);
    };
    match v.get_type().map_err(fail)? {
        ValueType::Undefined => Ok(None),
        ValueType::String => Ok(Some(RedisConfig::from_url(
            &checked_cast::<String>(&v).map_err(fail)?,
        ))),
        ValueType::Object if !v.is_array().map_err(fail)? => {
            let o = checked_cast::<Object>(&v).map_err(fail)?;
            known_names(
                &o,
                &[
                    "url",
                    "host",
                    "port",
                    "path",
                    "username",
                    "password",
                    "db",
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
            let text = |name: &str, label: &str| {
                typed_option::<String>(&o, name, label, ValueType::String, "a string")
            };
            config.parts = RedisParts {
                host: text("host", "redis.host")?,
                port: number_option(&o, "port", "redis.port")?,
                path: text("path", "redis.path")?,
                username: text("username", "redis.username")?,
                password: text("password", "redis.password")?,
                db: number_option(&o, "db", "redis.db")?,
            };
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
                        let t = checked_cast::<Object>(&tls).map_err(fail)?;
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
        let instead = match (what, bad.as_str()) {
            ("redis", "keyPrefix") => "; ioredis's keyPrefix is the constructor's `namespace`",
            ("redis", "retryStrategy" | "maxRetriesPerRequest" | "reconnectOnError") => {
                "; the cache retries by itself (it probes a Redis that failed every 250 ms)"
            }
            _ => "",
        };
        return Err(js_err(CoreError::invalid_option(
            bad,
            format!(
                "is not an option of {what} (its options: {}){instead}",
                allowed.join(", ")
            ),
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
/// The constructor's options, validated (`None`: every default).
pub(super) fn engine_options(options: Option<&Object>) -> Result<Options, JsErr> {
    let mut raw = RawOptions::default();
    if let Some(obj) = options {
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
        raw.tag_ttl = number_option(obj, "tagTtl", "tagTtl")?;
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
                ValueType::Boolean if !checked_cast::<bool>(&l1).unwrap_or(true) => {
                    raw.l1 = Some(None)
                }
                ValueType::Object
                    if !l1
                        .is_array()
                        .map_err(|e| napi_fail(ErrorCode::InvalidOption, e))? =>
                {
                    let l1obj = checked_cast::<Object>(&l1)
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
    Options::validate(raw).map_err(js_err)
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
                checked_cast::<String>(&key).map_err(|e| napi_fail(ErrorCode::InvalidKey, e))?;
            key::check(&s).map_err(js_err)?;
            Ok(s)
        }
        ValueType::Object
            if key
                .is_array()
                .map_err(|e| napi_fail(ErrorCode::InvalidKey, e))? =>
        {
            let arr =
                checked_cast::<Array>(&key).map_err(|e| napi_fail(ErrorCode::InvalidKey, e))?;
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
                    ValueType::String => checked_cast::<String>(&part),
                    ValueType::Number => {
                        let n = checked_cast::<f64>(&part)
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
/// with (see `policy_vec`).
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

/// A policy as the facade holds it: `POLICY_FIELDS` numbers, indexed by the `POLICY_*` codes.
fn policy_vec(p: &EntryPolicy) -> Vec<f64> {
    let mut v = vec![0.0; POLICY_FIELDS as usize];
    for (i, x) in [
        (POLICY_TTL, p.ttl),
        (POLICY_HARD_TTL, p.hard_ttl),
        (POLICY_NEGATIVE_TTL, p.negative_ttl),
        (POLICY_JITTER, p.jitter),
        (POLICY_BETA, p.beta),
        (POLICY_LOAD_TIMEOUT, p.load_timeout),
    ] {
        v[i as usize] = x;
    }
    v
}

/// The policy the facade passed (see `policy_vec`), or the constructor's for none.
pub(super) fn policy_of(c: &EngineState, p: Option<&[f64]>) -> EntryPolicy {
    match p {
        Some(p) if p.len() >= POLICY_FIELDS as usize => {
            let at = |i: u32| p[i as usize];
            EntryPolicy {
                ttl: at(POLICY_TTL),
                hard_ttl: at(POLICY_HARD_TTL),
                negative_ttl: at(POLICY_NEGATIVE_TTL),
                jitter: at(POLICY_JITTER),
                beta: at(POLICY_BETA),
                load_timeout: at(POLICY_LOAD_TIMEOUT),
            }
        }
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

/// What a loader returned, as the facade hands it to `complete` or `writeBack`: the loader's
/// time, whether it found nothing, the policy `ctx.setTtl` left (null: the call's defaults),
/// the tags and the serialized size. One object: each is a fact only the facade has. (An
/// object's field is `None` when absent and `Some(None)` when null.)
#[napi(object)]
pub struct LoadResult {
    pub compute_ms: f64,
    pub negative: bool,
    pub policy: Option<Option<Vec<f64>>>,
    pub tags: Option<Option<Vec<String>>>,
    pub size: f64,
}

/// The result as the engine writes it (`inherit`: see `Loaded`).
pub(super) fn loaded_of(c: &EngineState, r: LoadResult, inherit: bool) -> Loaded {
    Loaded {
        compute_ms: r.compute_ms,
        negative: r.negative,
        policy: policy_of(c, r.policy.flatten().as_deref()),
        extra: Extra {
            tags: r.tags.flatten().unwrap_or_default(),
            size: r.size as u64,
        },
        inherit,
    }
}
