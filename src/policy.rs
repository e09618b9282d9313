//! Options: their defaults, their validation (every error names the option), and how a call's
//! overrides combine with the constructor's into the policy one entry is written with.

use std::fmt;
use std::time::Duration;

use crate::envelope::Serializer;
use crate::error::{Error, Result};
pub use crate::redis_parts::RedisParts;
use crate::redis_parts::Target;

pub const DEFAULT_TTL_MS: f64 = 60_000.0;
pub const DEFAULT_HARD_TTL_FACTOR: f64 = 10.0;
pub const DEFAULT_JITTER: f64 = 0.1;
pub const DEFAULT_BETA: f64 = 1.0;
pub const DEFAULT_NEGATIVE_TTL_MS: f64 = 5_000.0;
pub const DEFAULT_LOCK_TTL_MS: f64 = 10_000.0;
pub const DEFAULT_ERROR_BACKOFF_MS: f64 = 5_000.0;
pub const DEFAULT_L1_MAX_ENTRIES: usize = 10_000;
pub const DEFAULT_LOAD_TIMEOUT_MS: f64 = 30_000.0;
/// Background refreshes one instance runs at once. A mass expiry (many keys written together,
/// expiring together) otherwise refreshes every key read in the same few hundred ms, and the
/// database sees all of them at once; past the bound, readers keep getting the stale value and a
/// later read refreshes the key. About one database connection pool's worth: a pool of 10-20 is
/// what a Node service usually keeps, and cold loads (never bounded) still need connections.
pub const DEFAULT_MAX_REFRESHES: usize = 16;
pub const DEFAULT_NAMESPACE: &str = "sc";

/// The option names the constructor accepts; any other name is an error.
pub const CONSTRUCTOR_OPTIONS: &[&str] = &[
    "redis",
    "namespace",
    "ttl",
    "hardTtl",
    "jitter",
    "beta",
    "negativeTtl",
    "lockTtl",
    "errorBackoff",
    "tagTtl",
    "l1",
    "loadTimeout",
    "maxConcurrentRefreshes",
    "serializer",
    "waitUntil",
    "onError",
];

/// The option names `getOrLoad` accepts.
pub const CALL_OPTIONS: &[&str] = &[
    "ttl",
    "hardTtl",
    "negativeTtl",
    "beta",
    "jitter",
    "loadTimeout",
    "signal",
    "waitUntil",
    "forceRefresh",
    "tags",
];

/// The option names `set` accepts.
pub const SET_OPTIONS: &[&str] = &["ttl", "hardTtl", "tags"];

/// How one entry is written and read: the constructor's defaults, or a call's overrides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntryPolicy {
    pub ttl: f64,
    pub hard_ttl: f64,
    pub negative_ttl: f64,
    pub jitter: f64,
    pub beta: f64,
    /// Ms a load may run before its callers reject with ERR_LOAD_TIMEOUT; infinite for none.
    pub load_timeout: f64,
}

/// The TTL-like numbers a call (or the constructor) may give; `None` where it gave none.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TtlOverrides {
    pub ttl: Option<f64>,
    pub hard_ttl: Option<f64>,
    pub negative_ttl: Option<f64>,
    pub jitter: Option<f64>,
    pub beta: Option<f64>,
    pub load_timeout: Option<f64>,
}

/// Validated constructor options (the JS functions `waitUntil` and `onError` stay in JS).
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub redis: Option<RedisConfig>,
    pub namespace: String,
    pub defaults: EntryPolicy,
    /// The hardTtl the constructor was given, if any (else each entry gets 10 x its ttl).
    pub explicit_hard_ttl: Option<f64>,
    pub lock_ttl: f64,
    pub error_backoff: f64,
    /// `tagTtl`: how long an entry carrying tags may live in all (its hardTtl is clamped to it),
    /// so a deleteByTag's record in Redis needs to outlive it by that much only.
    pub tag_ttl: f64,
    /// `None` when the in-process tier is off (`l1: false`).
    pub l1_max_entries: Option<usize>,
    /// `l1.maxBytes`: the in-process tier's budget of serialized bytes (`None`: count only).
    pub l1_max_bytes: Option<u64>,
    /// What values are serialized with (the functions of a custom one stay in JS).
    pub serializer: Serializer,
    /// `maxConcurrentRefreshes`: background refreshes (stale or XFetch) running at once;
    /// `usize::MAX` for no bound.
    pub max_refreshes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            redis: None,
            namespace: DEFAULT_NAMESPACE.to_string(),
            defaults: EntryPolicy {
                ttl: DEFAULT_TTL_MS,
                hard_ttl: DEFAULT_TTL_MS * DEFAULT_HARD_TTL_FACTOR,
                negative_ttl: DEFAULT_NEGATIVE_TTL_MS,
                jitter: DEFAULT_JITTER,
                beta: DEFAULT_BETA,
                load_timeout: DEFAULT_LOAD_TIMEOUT_MS,
            },
            explicit_hard_ttl: None,
            lock_ttl: DEFAULT_LOCK_TTL_MS,
            error_backoff: DEFAULT_ERROR_BACKOFF_MS,
            tag_ttl: MAX_HARD_TTL_MS,
            l1_max_entries: Some(DEFAULT_L1_MAX_ENTRIES),
            l1_max_bytes: None,
            serializer: Serializer::Json,
            max_refreshes: DEFAULT_MAX_REFRESHES,
        }
    }
}

/// What the constructor was given, before validation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawOptions {
    pub redis: Option<RedisConfig>,
    pub namespace: Option<String>,
    pub ttls: TtlOverrides,
    pub lock_ttl: Option<f64>,
    pub error_backoff: Option<f64>,
    pub tag_ttl: Option<f64>,
    /// `Some(None)`: `l1: false`; `Some(Some(n))`: `l1: { maxEntries: n }`.
    pub l1: Option<Option<f64>>,
    /// `l1: { maxBytes }`.
    pub l1_max_bytes: Option<f64>,
    /// `'json'`, `'v8'`, or `'custom'` (the facade's name for an object with the two functions).
    pub serializer: Option<String>,
    pub max_refreshes: Option<f64>,
}

// The maxima of the numeric options (the README's options table lists them). No value the
// constructor accepts may abort the process or misbehave later: past these, ERR_INVALID_OPTION.

/// The longest delay a JS timer takes, 2^31-1 ms (about 24.8 days): Node fires a longer
/// `setTimeout` at once. The maximum of every option that is a wait (`loadTimeout`, `lockTtl`,
/// `redis.connectTimeout`, `redis.commandTimeout`): they are timers, or deadlines as far off as
/// one, and no wait for a load, a lock or a reply is meant to outlast it.
pub const MAX_WAIT_MS: f64 = 2_147_483_647.0;
/// How long an entry may be fresh (`ttl`, `negativeTtl`) or a failed refresh hold refreshes back
/// (`errorBackoff`): 365 days. Entries are also fresh across restarts and processes, so a
/// timer's limit would be needlessly short; past a year a cache entry is a mistake, not a policy.
pub const MAX_TTL_MS: f64 = 365.0 * 24.0 * 3_600_000.0;
/// How long an entry lives at all (`hardTtl`): ten years, so that the default of 10 x ttl always
/// fits. Far inside what Redis (PX in i64 ms) and the f64 ms timestamps hold exactly.
pub const MAX_HARD_TTL_MS: f64 = DEFAULT_HARD_TTL_FACTOR * MAX_TTL_MS;
/// `beta`: XFetch refreshes early by `-ln(rand) * beta * computeMs`; by 1e6 every read of a key
/// that took a millisecond to compute already refreshes it up to ~16 minutes early (more,
/// over a fresh period it cannot exceed), so larger values mean nothing more.
pub const MAX_BETA: f64 = 1e6;
/// `l1.maxEntries` and `maxConcurrentRefreshes`: 2^32-1, a count no process reaches.
pub const MAX_COUNT: f64 = u32::MAX as f64;
/// `l1.maxBytes`: 2^53-1 (`Number.MAX_SAFE_INTEGER`), the largest whole number a JS number holds.
pub const MAX_BYTES: f64 = 9_007_199_254_740_991.0;

/// The (ttl, hardTtl) an entry carrying tags is written with: it must die within `tag_ttl` of
/// its birth, since a deleteByTag's record in Redis lives `tag_ttl` (plus a margin) and an
/// entry born before a deletion must be gone before that record is. It was born as its load
/// began, `compute_ms` before now, so that much comes off; its ttl stays within its hardTtl. A
/// hardTtl of 0 or less (a load longer than `tag_ttl`) caches nothing.
pub fn clamp_tagged(ttl: f64, hard_ttl: f64, tag_ttl: f64, compute_ms: f64) -> (f64, f64) {
    let hard = hard_ttl.min(tag_ttl - compute_ms.max(0.0));
    (ttl.min(hard), hard)
}

/// A number as a message shows it: JS's way for large ones (`1e+300`, not 301 digits).
fn shown(v: f64) -> String {
    if v.is_finite() && v.abs() >= 1e21 {
        let e = format!("{v:e}");
        e.replacen('e', "e+", 1).replace("e+-", "e-")
    } else {
        format!("{v}")
    }
}

/// A maximum as a message shows it: ms and a rounded human unit.
fn max_ms(max: f64) -> String {
    let days = max / 86_400_000.0;
    if days >= 365.0 {
        let years = (days / 365.0).round();
        let unit = if years == 1.0 { "year" } else { "years" };
        format!("{} ms ({years} {unit})", shown(max))
    } else {
        format!("{} ms (about {:.1} days)", shown(max), days)
    }
}

fn too_large(name: &str, max: String, v: f64) -> Error {
    Error::invalid_option(name, format!("must be at most {max}, got {}", shown(v)))
}

/// A duration in ms: finite, not negative, at most `max`.
pub fn duration(name: &str, v: f64, max: f64) -> Result<f64> {
    if !v.is_finite() {
        return Err(Error::invalid_option(
            name,
            format!("must be a finite number of ms, got {}", shown(v)),
        ));
    }
    if v < 0.0 {
        return Err(Error::invalid_option(
            name,
            format!("must not be negative, got {}", shown(v)),
        ));
    }
    if v > max {
        return Err(too_large(name, max_ms(max), v));
    }
    Ok(v)
}

fn jitter(v: f64) -> Result<f64> {
    if !(v.is_finite() && (0.0..1.0).contains(&v)) {
        return Err(Error::invalid_option(
            "jitter",
            format!("must be in [0, 1), got {}", shown(v)),
        ));
    }
    Ok(v)
}

fn beta(v: f64) -> Result<f64> {
    if !(v.is_finite() && v >= 0.0) {
        return Err(Error::invalid_option(
            "beta",
            format!("must be a finite number >= 0, got {}", shown(v)),
        ));
    }
    if v > MAX_BETA {
        return Err(too_large("beta", shown(MAX_BETA), v));
    }
    Ok(v)
}

/// A load timeout: a positive number of ms up to `MAX_WAIT_MS`, or `Infinity` for none.
fn load_timeout(v: f64) -> Result<f64> {
    if v.is_nan() || v <= 0.0 {
        return Err(Error::invalid_option(
            "loadTimeout",
            format!(
                "must be a positive number of ms or Infinity, got {}",
                shown(v)
            ),
        ));
    }
    if v > MAX_WAIT_MS && v != f64::INFINITY {
        return Err(too_large(
            "loadTimeout",
            format!("{} or Infinity", max_ms(MAX_WAIT_MS)),
            v,
        ));
    }
    Ok(v)
}

/// A timeout of the `redis` option: a positive number of ms up to `MAX_WAIT_MS`, as the
/// `Duration` the connections use (made checked, though the bound already makes it safe).
pub fn redis_timeout(name: &str, ms: f64) -> Result<Duration> {
    if !(ms.is_finite() && ms > 0.0) {
        return Err(Error::invalid_option(
            name,
            format!("must be a positive, finite number of ms, got {}", shown(ms)),
        ));
    }
    if ms > MAX_WAIT_MS {
        return Err(too_large(name, max_ms(MAX_WAIT_MS), ms));
    }
    Duration::try_from_secs_f64(ms / 1_000.0).map_err(|_| too_large(name, max_ms(MAX_WAIT_MS), ms))
}

/// A whole number in `[min, max]`, named `name` (`what` says what it counts).
fn whole(name: &str, v: f64, min: f64, max: f64, what: &str) -> Result<f64> {
    if !(v.is_finite() && v >= min && v.fract() == 0.0) {
        return Err(Error::invalid_option(
            name,
            format!("must be a whole number{what} >= {min}, got {}", shown(v)),
        ));
    }
    if v > max {
        return Err(too_large(name, shown(max), v));
    }
    Ok(v)
}

/// `maxConcurrentRefreshes`: a whole number >= 1, or `Infinity` for no bound. (0 would turn
/// stale-while-revalidate off; a cache that never refreshes wants `hardTtl: ttl` instead.)
fn max_refreshes(v: f64) -> Result<usize> {
    if v == f64::INFINITY {
        return Ok(usize::MAX);
    }
    if !(v.is_finite() && v >= 1.0 && v.fract() == 0.0) {
        return Err(Error::invalid_option(
            "maxConcurrentRefreshes",
            format!("must be a whole number >= 1 or Infinity, got {}", shown(v)),
        ));
    }
    if v > MAX_COUNT {
        return Err(too_large(
            "maxConcurrentRefreshes",
            format!("{} or Infinity", shown(MAX_COUNT)),
            v,
        ));
    }
    Ok(v as usize)
}

fn check_hard_ttl(ttl: f64, hard_ttl: f64) -> Result<()> {
    if hard_ttl < ttl {
        return Err(Error::invalid_option(
            "hardTtl",
            format!("({hard_ttl}) must be >= ttl ({ttl})"),
        ));
    }
    Ok(())
}

/// `url` as a message may show it: the password replaced by `***` (`redis://u:***@host:6379`),
/// and so is a `pass=`/`password=` query value (a unix URL's password). By text, not by parsing,
/// so a URL that does not parse is redacted too: the userinfo is everything between `://` (or
/// the start, without one) and the last `@`, since a password may hold a `/`, `?`, `#` or `@`
/// that a parser would take for the end of it. Of the userinfo, only a user name before a `:`
/// is shown; a userinfo without `:` may be a password given alone, and is hidden whole.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            if let Some((user, _)) = userinfo.split_once(':') {
                out.push_str(user);
                out.push(':');
            }
            out.push_str("***");
            out.push_str(&rest[at..]);
        }
        // `redis://:secret`, a password whose `@host` was left out, reads as an empty host and
        // a port; nothing after the `:` is worth showing.
        None if rest.starts_with(':') => out.push_str(":***"),
        None => out.push_str(rest),
    }
    redact_query_passwords(&out)
}

/// The names under which a URL's query may carry a password.
const PASSWORD_PARAMS: &[&str] = &["pass", "password"];

/// `text` with the value of every `pass=`/`password=` after a `?` or `&` replaced by `***`.
fn redact_query_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(['?', '&']) {
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
        let name_end = rest.find(['=', '&', '#']).unwrap_or(rest.len());
        let is_password = rest[name_end..].starts_with('=')
            && PASSWORD_PARAMS
                .iter()
                .any(|p| rest[..name_end].eq_ignore_ascii_case(p));
        if is_password {
            out.push_str(&rest[..=name_end]);
            out.push_str("***");
            let value_end = rest[name_end..]
                .find(['&', '#'])
                .map_or(rest.len(), |j| name_end + j);
            rest = &rest[value_end..];
        }
    }
    out.push_str(rest);
    out
}

/// The secrets `url` carries, as a message might spell them (as given, and percent-decoded):
/// the userinfo's password (or the whole userinfo without a `:`) and `pass=` query values.
fn url_secrets(url: &str) -> Vec<String> {
    let rest = url.find("://").map_or(url, |i| &url[i + 3..]);
    let mut raw = Vec::new();
    if let Some(at) = rest.rfind('@') {
        let userinfo = &rest[..at];
        raw.push(userinfo.split_once(':').map_or(userinfo, |(_, pw)| pw));
    }
    for (i, _) in url.match_indices(['?', '&']) {
        let pair = &url[i + 1..];
        let pair = &pair[..pair.find(['&', '#']).unwrap_or(pair.len())];
        if let Some((name, value)) = pair.split_once('=') {
            if PASSWORD_PARAMS.iter().any(|p| name.eq_ignore_ascii_case(p)) {
                raw.push(value);
            }
        }
    }
    let mut out = Vec::new();
    for s in raw {
        out.push(s.to_string());
        let decoded = percent_decode(s);
        if decoded != s {
            out.push(decoded);
        }
    }
    out
}

/// `%XX` decoded (invalid escapes kept as they are), lossily as UTF-8.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Accepts `redis://[user:pass@]host[:port][/db]` (and `rediss`, `valkey`, `valkeys`) and
/// `unix://…`/`redis+unix://…`/`valkey+unix://…`; `name` is the option it came from.
fn redis_url(name: &str, url: &str) -> Result<String> {
    let bad = |why: &str| {
        Error::invalid_option(
            name,
            format!("is not a Redis URL ({why}): {:?}", redact_url(url)),
        )
    };
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
    match scheme {
        "redis" | "rediss" | "valkey" | "valkeys" => {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            let (host, port) = if let Some(stripped) = host_port.strip_prefix('[') {
                let (h, p) = stripped.split_once(']').ok_or_else(|| bad("unclosed ["))?;
                (h, p.strip_prefix(':'))
            } else {
                match host_port.rsplit_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (host_port, None),
                }
            };
            if host.is_empty() {
                return Err(bad("no host"));
            }
            if let Some(p) = port {
                p.parse::<u16>().map_err(|_| bad("bad port"))?;
            }
            let path = rest[authority.len()..]
                .split(['?', '#'])
                .next()
                .unwrap_or("");
            let db = path.trim_start_matches('/');
            if !db.is_empty() {
                db.parse::<u32>().map_err(|_| bad("bad database number"))?;
            }
        }
        "unix" | "redis+unix" | "valkey+unix" => {
            if rest.is_empty() {
                return Err(bad("no socket path"));
            }
        }
        _ => return Err(bad("scheme must be redis, rediss, valkey, valkeys or unix")),
    }
    Ok(url.to_string())
}

/// How long the first connection may take before calls degrade, unless configured.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A command not answered within this counts as a Redis error, unless configured.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

/// TLS settings (`redis.tls`). Debug shows the PEM material's sizes, never its text.
#[derive(Clone, Default, PartialEq)]
pub struct TlsOptions {
    /// PEM of the CA(s) to trust instead of the system roots.
    pub ca: Option<Vec<u8>>,
    /// PEM client certificate and key (mutual TLS).
    pub cert: Option<Vec<u8>>,
    pub key: Option<Vec<u8>>,
    /// The name the server's certificate must carry (and SNI), when the URL's host is not it.
    pub servername: Option<String>,
    /// `false`: no verification at all (tests, or a server you trust by other means).
    pub reject_unauthorized: bool,
}

/// The `redis` option, validated: exactly one of `url`, `cluster` or `sentinels`. Debug shows
/// the URLs redacted (`redact_url`).
#[derive(Clone, PartialEq)]
pub struct RedisConfig {
    /// One server; with `sentinels`, only the primary's scheme, user, password and db.
    pub url: Option<String>,
    pub tls: Option<TlsOptions>,
    pub cluster: Vec<String>,
    pub sentinels: Vec<String>,
    pub master_name: Option<String>,
    pub connect_timeout: Duration,
    pub command_timeout: Duration,
    /// The server in ioredis's spelling, folded into `url` (or the seeds) by `fold_parts`.
    pub parts: RedisParts,
    /// Secrets given apart from any URL (`redis.password`), for `scrub`.
    pub secrets: Vec<String>,
}

/// PEM material as Debug shows it: its size only.
struct PemSize<'a>(&'a Option<Vec<u8>>);

impl fmt::Debug for PemSize<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(pem) => write!(f, "Some(<{} bytes of PEM>)", pem.len()),
            None => f.write_str("None"),
        }
    }
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca", &PemSize(&self.ca))
            .field("cert", &PemSize(&self.cert))
            .field("key", &PemSize(&self.key))
            .field("servername", &self.servername)
            .field("reject_unauthorized", &self.reject_unauthorized)
            .finish()
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |urls: &[String]| urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>();
        f.debug_struct("RedisConfig")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("tls", &self.tls)
            .field("cluster", &redacted(&self.cluster))
            .field("sentinels", &redacted(&self.sentinels))
            .field("master_name", &self.master_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("parts", &self.parts)
            .finish()
    }
}

impl RedisConfig {
    /// `text` (a message from the redis crate or the TLS library, say) with every URL of this
    /// configuration redacted and every password they carry replaced by `***`. A last guard
    /// for messages this library does not word itself; its own messages redact as they quote.
    pub fn scrub(&self, text: &str) -> String {
        let urls = self.url.iter().chain(&self.cluster).chain(&self.sentinels);
        let mut out = text.to_string();
        let mut secrets = Vec::new();
        for url in urls.clone() {
            if !url.is_empty() {
                out = out.replace(url.as_str(), &redact_url(url));
            }
            secrets.extend(url_secrets(url));
        }
        secrets.extend(self.secrets.iter().cloned());
        // Longest first, so a password that holds a shorter one is replaced whole. A secret of
        // one or two characters would mangle every message and hides nothing worth hiding.
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        for secret in secrets
            .iter()
            .filter(|s| s.len() >= 3 && s.as_str() != "***")
        {
            out = out.replace(secret.as_str(), "***");
        }
        out
    }

    pub fn from_url(url: &str) -> Self {
        RedisConfig {
            url: Some(url.to_string()),
            tls: None,
            cluster: Vec::new(),
            sentinels: Vec::new(),
            master_name: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            parts: RedisParts::default(),
            secrets: Vec::new(),
        }
    }

    /// Folds `host`, `port`, `path`, `username`, `password` and `db` into the URL they name
    /// (`redis_parts.rs`): next to `url`, each part is given once; with `sentinels` they are the
    /// primary's; with `cluster`, every seed's credentials.
    pub fn fold_parts(&mut self) -> Result<()> {
        let parts = std::mem::take(&mut self.parts);
        let tls = self.tls.is_some();
        let target = if !self.cluster.is_empty() {
            Target::Cluster(&mut self.cluster)
        } else if !self.sentinels.is_empty() {
            Target::Sentinel(&mut self.url)
        } else {
            Target::Url(&mut self.url)
        };
        if let Some(password) = parts.fold(target, tls)? {
            self.secrets.push(password);
        }
        Ok(())
    }

    /// Checks the combination and every URL; the error names the option that is wrong.
    pub fn validate(&self) -> Result<()> {
        let bad = |name: &str, why: String| Err(Error::invalid_option(name, why));
        let topologies = [self.cluster.is_empty(), self.sentinels.is_empty()]
            .iter()
            .filter(|empty| !**empty)
            .count();
        if topologies > 1 {
            return bad(
                "redis",
                "takes either `cluster` or `sentinels`, not both".into(),
            );
        }
        if !self.sentinels.is_empty() && self.master_name.as_deref().unwrap_or("").is_empty() {
            return bad("redis.masterName", "is required with `sentinels`".into());
        }
        if self.sentinels.is_empty() && self.master_name.is_some() {
            return bad("redis.masterName", "goes with `sentinels`".into());
        }
        if topologies == 0 && self.url.is_none() {
            return bad(
                "redis",
                "needs a `url`, `cluster` seeds or `sentinels`".into(),
            );
        }
        if !self.cluster.is_empty() && self.url.is_some() {
            return bad(
                "redis.url",
                "does not go with `cluster` (give seed URLs)".into(),
            );
        }
        if let Some(url) = &self.url {
            redis_url("redis.url", url)?;
        }
        for (name, urls) in [
            ("redis.cluster", &self.cluster),
            ("redis.sentinels", &self.sentinels),
        ] {
            for url in urls {
                redis_url(name, url)?;
                if url.starts_with("unix") || url.contains("+unix") {
                    return bad(
                        name,
                        format!("needs host:port URLs, got {:?}", redact_url(url)),
                    );
                }
            }
        }
        if let Some(tls) = &self.tls {
            if tls.cert.is_some() != tls.key.is_some() {
                return bad(
                    "redis.tls",
                    "needs both `cert` and `key` for a client certificate".into(),
                );
            }
            for (name, pem) in [
                ("redis.tls.ca", &tls.ca),
                ("redis.tls.cert", &tls.cert),
                ("redis.tls.key", &tls.key),
            ] {
                if let Some(pem) = pem {
                    if !pem.windows(10).any(|w| w == b"-----BEGIN") {
                        return bad(name, "must be PEM text (-----BEGIN ...)".into());
                    }
                }
            }
        }
        Ok(())
    }

    /// A `rediss`/`valkeys` URL asks for TLS even without `tls` options.
    pub fn tls_wanted(&self) -> bool {
        let secure = |u: &String| u.starts_with("rediss://") || u.starts_with("valkeys://");
        self.url.iter().any(secure) || self.cluster.iter().any(secure)
    }
}

impl Options {
    pub fn validate(raw: RawOptions) -> Result<Options> {
        let mut o = Options::default();
        if let Some(mut config) = raw.redis {
            config.fold_parts()?;
            config.validate()?;
            o.redis = Some(config);
        }
        if let Some(ns) = raw.namespace {
            if ns.is_empty() || ns.len() > 128 {
                return Err(Error::invalid_option(
                    "namespace",
                    "must be 1 to 128 bytes long",
                ));
            }
            // Braces would move the Redis Cluster hash tag off the key, splitting a value from
            // its lock across slots.
            if ns.contains(['{', '}']) {
                return Err(Error::invalid_option(
                    "namespace",
                    "must not contain `{` or `}`",
                ));
            }
            o.namespace = ns;
        }
        let t = raw.ttls;
        if let Some(v) = t.ttl {
            o.defaults.ttl = duration("ttl", v, MAX_TTL_MS)?;
        }
        match t.hard_ttl {
            Some(v) => {
                let h = duration("hardTtl", v, MAX_HARD_TTL_MS)?;
                check_hard_ttl(o.defaults.ttl, h)?;
                o.defaults.hard_ttl = h;
                o.explicit_hard_ttl = Some(h);
            }
            None => o.defaults.hard_ttl = o.defaults.ttl * DEFAULT_HARD_TTL_FACTOR,
        }
        if let Some(v) = t.jitter {
            o.defaults.jitter = jitter(v)?;
        }
        if let Some(v) = t.beta {
            o.defaults.beta = beta(v)?;
        }
        if let Some(v) = t.negative_ttl {
            o.defaults.negative_ttl = duration("negativeTtl", v, MAX_TTL_MS)?;
        }
        if let Some(v) = t.load_timeout {
            o.defaults.load_timeout = load_timeout(v)?;
        }
        if let Some(v) = raw.lock_ttl {
            o.lock_ttl = duration("lockTtl", v, MAX_WAIT_MS)?;
            if o.lock_ttl < 1.0 {
                return Err(Error::invalid_option("lockTtl", "must be at least 1 ms"));
            }
        }
        if let Some(v) = raw.error_backoff {
            o.error_backoff = duration("errorBackoff", v, MAX_TTL_MS)?;
        }
        if let Some(v) = raw.tag_ttl {
            o.tag_ttl = duration("tagTtl", v, MAX_HARD_TTL_MS)?;
            if o.tag_ttl < 1.0 {
                return Err(Error::invalid_option("tagTtl", "must be at least 1 ms"));
            }
        }
        if let Some(v) = raw.max_refreshes {
            o.max_refreshes = max_refreshes(v)?;
        }
        match raw.l1 {
            None => {}
            Some(None) => o.l1_max_entries = None,
            Some(Some(n)) => {
                let n = whole("l1.maxEntries", n, 0.0, MAX_COUNT, "")?;
                o.l1_max_entries = if n == 0.0 { None } else { Some(n as usize) };
            }
        }
        if let Some(n) = raw.l1_max_bytes {
            o.l1_max_bytes = Some(whole("l1.maxBytes", n, 0.0, MAX_BYTES, " of bytes")? as u64);
        }
        if let Some(name) = raw.serializer {
            o.serializer = Serializer::parse(&name).ok_or_else(|| {
                Error::invalid_option(
                    "serializer",
                    format!("must be 'json', 'v8' or {{ serialize, deserialize }}, got {name:?}"),
                )
            })?;
        }
        Ok(o)
    }

    /// The policy one call writes with: its overrides over the constructor's defaults.
    /// A call's ttl without a hardTtl gets the constructor's hardTtl if that was given
    /// (but never less than the ttl), else 10 x the call's ttl.
    pub fn resolve(&self, call: &TtlOverrides) -> Result<EntryPolicy> {
        let mut p = self.defaults;
        if let Some(v) = call.ttl {
            p.ttl = duration("ttl", v, MAX_TTL_MS)?;
            p.hard_ttl = match self.explicit_hard_ttl {
                Some(h) => h.max(p.ttl),
                None => p.ttl * DEFAULT_HARD_TTL_FACTOR,
            };
        }
        if let Some(v) = call.hard_ttl {
            p.hard_ttl = duration("hardTtl", v, MAX_HARD_TTL_MS)?;
            check_hard_ttl(p.ttl, p.hard_ttl)?;
        }
        if let Some(v) = call.negative_ttl {
            p.negative_ttl = duration("negativeTtl", v, MAX_TTL_MS)?;
        }
        if let Some(v) = call.jitter {
            p.jitter = jitter(v)?;
        }
        if let Some(v) = call.beta {
            p.beta = beta(v)?;
        }
        if let Some(v) = call.load_timeout {
            p.load_timeout = load_timeout(v)?;
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    fn raw(f: impl FnOnce(&mut RawOptions)) -> RawOptions {
        let mut r = RawOptions::default();
        f(&mut r);
        r
    }

    fn err_names(r: RawOptions, name: &str) {
        let e = Options::validate(r).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOption);
        assert!(e.message.contains(name), "{} should name {name}", e.message);
    }

    #[test]
    fn tag_ttl_defaults_to_the_longest_hard_ttl_and_is_checked() {
        let o = Options::validate(RawOptions::default()).unwrap();
        assert_eq!(o.tag_ttl, MAX_HARD_TTL_MS);
        let o = Options::validate(raw(|r| r.tag_ttl = Some(300.0))).unwrap();
        assert_eq!(o.tag_ttl, 300.0);
        for bad in [
            f64::NAN,
            f64::INFINITY,
            -1.0,
            0.0,
            0.5,
            MAX_HARD_TTL_MS + 1.0,
        ] {
            err_names(raw(|r| r.tag_ttl = Some(bad)), "tagTtl");
        }
        let e = Options::validate(raw(|r| r.tag_ttl = Some(MAX_HARD_TTL_MS * 2.0))).unwrap_err();
        assert!(e.message.contains("315360000000"), "{}", e.message);
    }

    #[test]
    fn tagged_lifetimes_are_clamped_to_tag_ttl_from_birth() {
        // Within the bound: unchanged.
        assert_eq!(clamp_tagged(10.0, 100.0, 1_000.0, 5.0), (10.0, 100.0));
        // The hardTtl is cut to what is left of tagTtl since the load began.
        assert_eq!(clamp_tagged(10.0, 5_000.0, 1_000.0, 200.0), (10.0, 800.0));
        // The ttl never outlives the hardTtl.
        assert_eq!(clamp_tagged(900.0, 5_000.0, 1_000.0, 200.0), (800.0, 800.0));
        // A load longer than tagTtl leaves nothing to cache.
        assert!(clamp_tagged(10.0, 100.0, 1_000.0, 1_500.0).1 <= 0.0);
        // A negative compute time (a clock step) never lengthens it.
        assert_eq!(clamp_tagged(10.0, 5_000.0, 1_000.0, -50.0), (10.0, 1_000.0));
    }

    #[test]
    fn defaults_match_the_contract() {
        let o = Options::validate(RawOptions::default()).unwrap();
        assert_eq!(o.defaults.ttl, 60_000.0);
        assert_eq!(o.defaults.hard_ttl, 600_000.0);
        assert_eq!(o.defaults.jitter, 0.1);
        assert_eq!(o.defaults.beta, 1.0);
        assert_eq!(o.defaults.negative_ttl, 5_000.0);
        assert_eq!(o.lock_ttl, 10_000.0);
        assert_eq!(o.error_backoff, 5_000.0);
        assert_eq!(o.max_refreshes, DEFAULT_MAX_REFRESHES);
        let unbounded = Options::validate(raw(|r| r.max_refreshes = Some(f64::INFINITY))).unwrap();
        assert_eq!(unbounded.max_refreshes, usize::MAX);
        assert_eq!(o.l1_max_entries, Some(10_000));
        assert_eq!(o.namespace, "sc");
    }

    #[test]
    fn hard_ttl_defaults_to_ten_times_ttl() {
        let o = Options::validate(raw(|r| r.ttls.ttl = Some(1_000.0))).unwrap();
        assert_eq!(o.defaults.hard_ttl, 10_000.0);
    }

    #[test]
    fn bad_numbers_name_their_option() {
        err_names(raw(|r| r.ttls.ttl = Some(-1.0)), "ttl");
        err_names(raw(|r| r.ttls.ttl = Some(f64::NAN)), "ttl");
        err_names(raw(|r| r.ttls.ttl = Some(f64::INFINITY)), "ttl");
        err_names(
            raw(|r| {
                r.ttls.ttl = Some(100.0);
                r.ttls.hard_ttl = Some(50.0);
            }),
            "hardTtl",
        );
        err_names(raw(|r| r.ttls.jitter = Some(1.0)), "jitter");
        err_names(raw(|r| r.ttls.jitter = Some(-0.1)), "jitter");
        err_names(raw(|r| r.ttls.beta = Some(-1.0)), "beta");
        err_names(raw(|r| r.ttls.negative_ttl = Some(-5.0)), "negativeTtl");
        err_names(raw(|r| r.lock_ttl = Some(0.0)), "lockTtl");
        err_names(raw(|r| r.error_backoff = Some(f64::NAN)), "errorBackoff");
        for bad in [0.0, -1.0, 1.5, f64::NAN, f64::NEG_INFINITY] {
            err_names(
                raw(|r| r.max_refreshes = Some(bad)),
                "maxConcurrentRefreshes",
            );
        }
        err_names(raw(|r| r.l1 = Some(Some(1.5))), "l1.maxEntries");
        err_names(raw(|r| r.namespace = Some(String::new())), "namespace");
        err_names(raw(|r| r.l1_max_bytes = Some(-1.0)), "l1.maxBytes");
        err_names(raw(|r| r.l1_max_bytes = Some(0.5)), "l1.maxBytes");
        err_names(raw(|r| r.serializer = Some("yaml".into())), "serializer");
    }

    #[test]
    fn redis_urls_are_checked() {
        for ok in [
            "redis://127.0.0.1:6379/0",
            "redis://localhost",
            "redis://:secret@127.0.0.1:6380",
            "rediss://user:pw@[::1]:6379/2",
            "unix:///tmp/redis.sock",
            "valkey://127.0.0.1",
            "valkeys://h:6380/1",
        ] {
            assert!(
                Options::validate(raw(|r| r.redis = Some(RedisConfig::from_url(ok)))).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "",
            "127.0.0.1:6379",
            "http://x",
            "redis://",
            "redis://h:port",
            "redis://h:1/x",
            "redis://h:99999",
        ] {
            err_names(raw(|r| r.redis = Some(RedisConfig::from_url(bad))), "redis");
        }
    }

    const PW: &str = "hunterMARK27";

    #[test]
    fn redact_url_hides_the_password_of_every_url_well_formed_or_not() {
        for (url, shown) in [
            (
                "redis://u:pw@127.0.0.1:6379/2",
                "redis://u:***@127.0.0.1:6379/2",
            ),
            ("rediss://:pw@h:6380", "rediss://:***@h:6380"),
            ("redis://pw@h", "redis://***@h"),
            ("redis://u:p@w@h:1", "redis://u:***@h:1"),
            ("redis://u:p/w@h:bad", "redis://u:***@h:bad"),
            ("redis://u:p?w#x@h", "redis://u:***@h"),
            ("redis://u:pw@[::1:6379", "redis://u:***@[::1:6379"),
            ("u:pw@h:6379", "u:***@h:6379"),
            ("redis//u:pw@h", "redis//u:***@h"),
            ("redis://:pw", "redis://:***"),
            (
                "unix:///s.sock?db=1&pass=pw",
                "unix:///s.sock?db=1&pass=***",
            ),
            (
                "unix:///s.sock?PASSWORD=pw#f",
                "unix:///s.sock?PASSWORD=***#f",
            ),
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            ("redis://h:notaport", "redis://h:notaport"),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    /// Malformed URLs (as __test__/redaction.test.js sends them), with the marker as password:
    /// every error quotes none.
    fn marked_urls() -> Vec<String> {
        [
            "redis://u:{}@127.0.0.1:notaport",
            "redis://u:{}@127.0.0.1:99999",
            "redis://u:{}@h:1/notadb",
            "http://u:{}@h:1",
            "redis://u:{}@[::1:1",
            "rediss://u:{}@h:1/x/y",
            "redis://u:{}/x@h:bad",
            "redis://:{}",
            "redis://{}@h:bad",
            "unix:///s?pass={}",
            "redis+unix:///s?db=x&pass={}",
        ]
        .iter()
        .map(|t| t.replace("{}", PW))
        .collect()
    }

    #[test]
    fn no_validation_error_quotes_a_password() {
        for url in marked_urls() {
            let ok = "redis://u:ok@127.0.0.1:1".to_string();
            let configs = [
                RedisConfig::from_url(&url),
                RedisConfig {
                    url: None,
                    cluster: vec![ok.clone(), url.clone()],
                    ..RedisConfig::from_url("")
                },
                RedisConfig {
                    url: Some(ok.clone()),
                    sentinels: vec![url.clone()],
                    master_name: Some("m".into()),
                    ..RedisConfig::from_url("")
                },
            ];
            for config in configs {
                assert!(!format!("{config:?}").contains(PW), "{config:?}");
                if let Err(e) = Options::validate(raw(|r| r.redis = Some(config.clone()))) {
                    assert!(!e.message.contains(PW), "{}", e.message);
                }
            }
        }
    }

    #[test]
    fn debug_of_the_options_shows_no_password_and_no_tls_material() {
        let mut config = RedisConfig::from_url(&format!("rediss://u:{PW}@h:6380"));
        config.cluster = vec![format!("redis://:{PW}@h:1")];
        config.tls = Some(TlsOptions {
            ca: Some(format!("-----BEGIN CERTIFICATE-----{PW}").into_bytes()),
            cert: Some(PW.as_bytes().to_vec()),
            key: Some(PW.as_bytes().to_vec()),
            servername: None,
            reject_unauthorized: true,
        });
        let raw_options = raw(|r| r.redis = Some(config.clone()));
        for text in [
            format!("{config:?}"),
            format!("{config:#?}"),
            format!("{raw_options:?}"),
        ] {
            assert!(!text.contains(PW), "{text}");
            let bytes = PW.bytes().map(|b| b.to_string()).collect::<Vec<_>>();
            assert!(!text.contains(&bytes.join(", ")), "{text}");
        }
        assert!(format!("{config:?}").contains("u:***@h:6380"));
        assert!(format!("{config:?}").contains("bytes of PEM"));
    }

    #[test]
    fn scrub_replaces_urls_and_passwords_as_given_and_decoded() {
        let config = RedisConfig {
            url: Some("redis://u:p%40ss-word@h:1".into()),
            sentinels: vec!["unix:///s?pass=qw%21rty".into()],
            ..RedisConfig::from_url("")
        };
        let said =
            "failed for redis://u:p%40ss-word@h:1 (p@ss-word), p%40ss-word, qw!rty, qw%21rty";
        let scrubbed = config.scrub(said);
        for secret in ["p@ss-word", "p%40ss-word", "qw!rty", "qw%21rty"] {
            assert!(!scrubbed.contains(secret), "{scrubbed}");
        }
        assert!(scrubbed.contains("redis://u:***@h:1"), "{scrubbed}");
        // A one-letter password is not hunted for (it would mangle the message).
        let short = RedisConfig::from_url("redis://:a@h:1");
        assert_eq!(short.scrub("a failure at h"), "a failure at h");
    }

    /// Sets one option's value.
    type SetRaw = fn(&mut RawOptions, f64);
    type SetCall = fn(&mut TtlOverrides, f64);

    /// Every numeric option: its maximum, and how a constructor's value is set on `RawOptions`.
    fn numeric_options() -> Vec<(&'static str, f64, SetRaw)> {
        vec![
            ("ttl", MAX_TTL_MS, |r, v| {
                r.ttls.ttl = Some(v);
                r.ttls.hard_ttl = Some(MAX_HARD_TTL_MS);
            }),
            ("hardTtl", MAX_HARD_TTL_MS, |r, v| r.ttls.hard_ttl = Some(v)),
            ("negativeTtl", MAX_TTL_MS, |r, v| {
                r.ttls.negative_ttl = Some(v)
            }),
            ("beta", MAX_BETA, |r, v| r.ttls.beta = Some(v)),
            ("lockTtl", MAX_WAIT_MS, |r, v| r.lock_ttl = Some(v)),
            ("errorBackoff", MAX_TTL_MS, |r, v| r.error_backoff = Some(v)),
            ("loadTimeout", MAX_WAIT_MS, |r, v| {
                r.ttls.load_timeout = Some(v)
            }),
            ("l1.maxEntries", MAX_COUNT, |r, v| r.l1 = Some(Some(v))),
            ("l1.maxBytes", MAX_BYTES, |r, v| r.l1_max_bytes = Some(v)),
            ("maxConcurrentRefreshes", MAX_COUNT, |r, v| {
                r.max_refreshes = Some(v)
            }),
        ]
    }

    #[test]
    fn every_numeric_option_has_a_maximum_named_in_its_error() {
        for (name, max, set) in numeric_options() {
            assert!(
                Options::validate(raw(|r| set(r, max))).is_ok(),
                "{name} at its maximum"
            );
            // The next whole number past it, and the values that used to abort.
            for past in [max + 1.0, max * 2.0, 1e22, 1e300, f64::MAX] {
                let e = Options::validate(raw(|r| set(r, past))).unwrap_err();
                assert_eq!(e.code, ErrorCode::InvalidOption, "{name} = {past}");
                assert!(e.message.contains(&format!("`{name}`")), "{}", e.message);
                assert!(e.message.contains(&shown(max)), "{}", e.message);
                assert!(e.message.len() < 200, "{}", e.message);
            }
        }
        // jitter's maximum is the open end of [0, 1).
        assert!(Options::validate(raw(|r| r.ttls.jitter = Some(0.999_999))).is_ok());
        err_names(raw(|r| r.ttls.jitter = Some(f64::MAX)), "jitter");
        // Infinity stays the way to say "none" for the two that allow it.
        assert!(Options::validate(raw(|r| r.ttls.load_timeout = Some(f64::INFINITY))).is_ok());
        assert!(Options::validate(raw(|r| r.max_refreshes = Some(f64::INFINITY))).is_ok());
    }

    #[test]
    fn a_calls_numbers_have_the_same_maxima() {
        let o = Options::validate(RawOptions::default()).unwrap();
        let call = |f: SetCall, v: f64| {
            let mut t = TtlOverrides::default();
            f(&mut t, v);
            o.resolve(&t)
        };
        let setters: [(&str, f64, SetCall); 5] = [
            ("ttl", MAX_TTL_MS, |t, v| t.ttl = Some(v)),
            ("hardTtl", MAX_HARD_TTL_MS, |t, v| t.hard_ttl = Some(v)),
            ("negativeTtl", MAX_TTL_MS, |t, v| t.negative_ttl = Some(v)),
            ("beta", MAX_BETA, |t, v| t.beta = Some(v)),
            ("loadTimeout", MAX_WAIT_MS, |t, v| t.load_timeout = Some(v)),
        ];
        for (name, max, set) in setters {
            assert!(call(set, max).is_ok(), "{name} at its maximum");
            for past in [max + 1.0, 1e22, f64::MAX] {
                let e = call(set, past).unwrap_err();
                assert!(e.message.contains(&format!("`{name}`")), "{}", e.message);
                assert!(e.message.contains(&shown(max)), "{}", e.message);
            }
        }
        // A call's ttl at its maximum gets the default hardTtl of 10 x, which fits.
        let p = call(|t, v| t.ttl = Some(v), MAX_TTL_MS).unwrap();
        assert_eq!(p.hard_ttl, MAX_HARD_TTL_MS);
    }

    #[test]
    fn redis_timeouts_are_bounded_durations() {
        let d = redis_timeout("redis.commandTimeout", MAX_WAIT_MS).unwrap();
        assert_eq!(d.as_millis(), MAX_WAIT_MS as u128);
        // Far-off deadlines as the connections compute them do not overflow.
        assert!(std::time::Instant::now().checked_add(d * 2).is_some());
        for bad in [
            MAX_WAIT_MS + 1.0,
            1e22,
            1e300,
            f64::MAX,
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
        ] {
            let e = redis_timeout("redis.connectTimeout", bad).unwrap_err();
            assert!(
                e.message.contains("`redis.connectTimeout`"),
                "{}",
                e.message
            );
        }
        assert!(redis_timeout("redis.connectTimeout", 1e22)
            .unwrap_err()
            .message
            .contains("2147483647 ms"));
    }

    /// A cache at every maximum at once works on a manual clock: it loads, hits, goes stale
    /// after the ttl and is gone after the hardTtl, with no arithmetic overflowing on the way.
    #[test]
    fn a_cache_at_every_maximum_works() {
        use crate::cache::{Cache, Loaded, Step};
        use crate::clock::ManualClock;
        use rand::{rngs::SmallRng, SeedableRng};
        let o = Options::validate(raw(|r| {
            r.ttls.ttl = Some(MAX_TTL_MS);
            r.ttls.hard_ttl = Some(MAX_HARD_TTL_MS);
            r.ttls.negative_ttl = Some(MAX_TTL_MS);
            r.ttls.beta = Some(MAX_BETA);
            r.ttls.jitter = Some(0.0);
            r.ttls.load_timeout = Some(MAX_WAIT_MS);
            r.lock_ttl = Some(MAX_WAIT_MS);
            r.error_backoff = Some(MAX_TTL_MS);
            r.l1 = Some(Some(MAX_COUNT));
            r.l1_max_bytes = Some(MAX_BYTES);
            r.max_refreshes = Some(MAX_COUNT);
        }))
        .unwrap();
        let clock = ManualClock::new(1_700_000_000_000.0);
        let mut c = Cache::with_clock(o, clock.clone(), SmallRng::seed_from_u64(7));
        let p = c.options().defaults;
        let Step::Lead(id) = c.lookup("k", 0.0, false).unwrap() else {
            panic!("expected to lead")
        };
        c.note_loader_call("k", id);
        let done = c.complete("k", id, Loaded::new(1.0, p)).unwrap();
        assert!(done.slot.is_some());
        assert!(c.peek("k", 0.0).is_some(), "a hit right after the load");
        clock.advance(MAX_TTL_MS + 1.0);
        assert!(c.peek("k", 0.0).is_some(), "stale, still served");
        clock.advance(MAX_HARD_TTL_MS);
        assert!(c.peek("k", 0.0).is_none(), "gone after hardTtl");
    }

    #[test]
    fn l1_zero_or_false_turns_the_tier_off() {
        assert_eq!(
            Options::validate(raw(|r| r.l1 = Some(None)))
                .unwrap()
                .l1_max_entries,
            None
        );
        assert_eq!(
            Options::validate(raw(|r| r.l1 = Some(Some(0.0))))
                .unwrap()
                .l1_max_entries,
            None
        );
        assert_eq!(
            Options::validate(raw(|r| r.l1 = Some(Some(5.0))))
                .unwrap()
                .l1_max_entries,
            Some(5)
        );
    }

    #[test]
    fn call_overrides_resolve_over_defaults() {
        let o = Options::validate(raw(|r| r.ttls.ttl = Some(1_000.0))).unwrap();
        let p = o
            .resolve(&TtlOverrides {
                ttl: Some(50.0),
                ..Default::default()
            })
            .unwrap();
        assert_eq!((p.ttl, p.hard_ttl), (50.0, 500.0));
        let p = o
            .resolve(&TtlOverrides {
                beta: Some(0.0),
                ..Default::default()
            })
            .unwrap();
        assert_eq!((p.ttl, p.hard_ttl, p.beta), (1_000.0, 10_000.0, 0.0));
        assert!(o
            .resolve(&TtlOverrides {
                ttl: Some(100.0),
                hard_ttl: Some(10.0),
                ..Default::default()
            })
            .is_err());

        let explicit = Options::validate(raw(|r| {
            r.ttls.ttl = Some(1_000.0);
            r.ttls.hard_ttl = Some(5_000.0);
        }))
        .unwrap();
        let p = explicit
            .resolve(&TtlOverrides {
                ttl: Some(100.0),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(p.hard_ttl, 5_000.0);
        let p = explicit
            .resolve(&TtlOverrides {
                ttl: Some(9_000.0),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(p.hard_ttl, 9_000.0);
    }
}
