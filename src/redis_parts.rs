//! The `redis` option's server in ioredis's spelling (`host`, `port`, `path`, `username`,
//! `password`, `db`), folded into the URL(s) it names, so that everything after validation (the
//! topology, the read lane, redaction) knows one form only.

use std::fmt;

use url::Url;

use crate::error::{Error, Result};

/// ioredis's default server, when only credentials or a db are given.
const DEFAULT_HOST: &str = "localhost";
const DEFAULT_PORT: u16 = 6379;
/// Redis's own bound on `databases` (an `int`).
const MAX_DB: f64 = 2_147_483_647.0;
/// Where a Sentinel primary's URL is only a carrier of its credentials and db: the sentinels
/// name its address.
const SENTINEL_PRIMARY: &str = "sentinel-primary";

/// The parts as given (numbers as JS gave them); `None`: not given.
#[derive(Clone, Default, PartialEq)]
pub struct RedisParts {
    pub host: Option<String>,
    pub port: Option<f64>,
    pub path: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: Option<f64>,
}

impl fmt::Debug for RedisParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisParts")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("path", &self.path)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .finish()
    }
}

/// Where the parts go: the one URL a single server or a Sentinel primary has, or the seeds.
pub enum Target<'a> {
    Url(&'a mut Option<String>),
    Sentinel(&'a mut Option<String>),
    Cluster(&'a mut [String]),
}

fn bad<T>(name: &str, why: impl fmt::Display) -> Result<T> {
    Err(Error::invalid_option(name, why))
}

impl RedisParts {
    fn is_empty(&self) -> bool {
        *self == RedisParts::default()
    }

    /// The part naming an address (not credentials), first of those given.
    fn address_part(&self) -> Option<&'static str> {
        [
            ("redis.host", self.host.is_some()),
            ("redis.port", self.port.is_some()),
            ("redis.path", self.path.is_some()),
        ]
        .into_iter()
        .find_map(|(name, given)| given.then_some(name))
    }

    /// Folds the parts into `target`, checking each (the error names the part, never quotes a
    /// password). `tls`: a `tls` option was given, so a URL made from the parts is `rediss://`,
    /// as ioredis turns TLS on for `tls: {}`. Returns the password, for redaction.
    pub fn fold(self, target: Target<'_>, tls: bool) -> Result<Option<String>> {
        if self.is_empty() {
            return Ok(None);
        }
        let port = self
            .port
            .map(|p| whole_in("redis.port", p, 1.0, 65_535.0))
            .transpose()?;
        let db = self
            .db
            .map(|d| whole_in("redis.db", d, 0.0, MAX_DB))
            .transpose()?;
        if let Some(host) = &self.host {
            check_host(host)?;
        }
        if let Some(path) = &self.path {
            if !path.starts_with('/') {
                return bad(
                    "redis.path",
                    "must be the absolute path of the server's Unix socket",
                );
            }
            if self.host.is_some() || self.port.is_some() {
                return bad(
                    "redis.path",
                    "names a Unix socket: it does not go with `host` or `port`",
                );
            }
        }
        // An empty credential is none, as ioredis reads it (`password: process.env.X ?? ''`).
        let username = self.username.clone().filter(|s| !s.is_empty());
        let password = self.password.clone().filter(|s| !s.is_empty());
        let credentials = Credentials {
            username: username.as_deref(),
            password: password.as_deref(),
            db,
        };
        match target {
            Target::Cluster(seeds) => {
                if let Some(name) = self.address_part() {
                    return bad(
                        name,
                        "does not go with `cluster`: the seed URLs name the servers",
                    );
                }
                if db.is_some() {
                    return bad(
                        "redis.db",
                        "does not go with `cluster`: a Redis Cluster has db 0 only",
                    );
                }
                for seed in seeds.iter_mut() {
                    *seed = credentials.merge("redis.cluster", seed)?;
                }
            }
            Target::Sentinel(url) => {
                if let Some(name) = self.address_part() {
                    return bad(
                        name,
                        "does not go with `sentinels`: the sentinels name the primary",
                    );
                }
                let scheme = if tls { "rediss" } else { "redis" };
                let carrier = url
                    .take()
                    .unwrap_or_else(|| format!("{scheme}://{SENTINEL_PRIMARY}"));
                *url = Some(credentials.merge("redis.url", &carrier)?);
            }
            Target::Url(url) => {
                let base = match url.take() {
                    Some(given) => {
                        if let Some(name) = self.address_part() {
                            return bad(
                                name,
                                "does not go with `url`: the URL names the server (give one or the other)",
                            );
                        }
                        given
                    }
                    None => match &self.path {
                        Some(path) => {
                            let mut u = Url::parse("unix:///").expect("a constant URL");
                            u.set_path(path);
                            u.to_string()
                        }
                        None => {
                            let host = self.host.as_deref().unwrap_or(DEFAULT_HOST);
                            let host = if host.contains(':') {
                                format!("[{host}]")
                            } else {
                                host.to_string()
                            };
                            let scheme = if tls { "rediss" } else { "redis" };
                            format!("{scheme}://{host}:{}", port.unwrap_or(DEFAULT_PORT))
                        }
                    },
                };
                *url = Some(credentials.merge("redis.url", &base)?);
            }
        }
        Ok(password)
    }
}

/// A whole number in `[min, max]`.
fn whole_in<T: TryFrom<u32>>(name: &str, v: f64, min: f64, max: f64) -> Result<T> {
    if !(v.is_finite() && v.fract() == 0.0 && v >= min && v <= max) {
        return bad(
            name,
            format!("must be a whole number from {min} to {max}, got {v}"),
        );
    }
    T::try_from(v as u32).or_else(|_| bad(name, format!("is out of range: {v}")))
}

/// A host name or address as a URL holds it: nothing that would end it or start another part.
fn check_host(host: &str) -> Result<()> {
    if host.is_empty() {
        return bad("redis.host", "must not be empty");
    }
    if let Some(c) = host
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || "/?#@[]\\%".contains(*c))
    {
        return bad(
            "redis.host",
            format!("must be a host name or an IP address, not {host:?} (it holds {c:?})"),
        );
    }
    Ok(())
}

/// `s` percent-encoded but for URL-unreserved characters: the url crate leaves a `%` in a
/// userinfo as it is, which the redis crate would then decode (`ab%41` read as `abA`).
fn escaped(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

struct Credentials<'a> {
    username: Option<&'a str>,
    password: Option<&'a str>,
    db: Option<u32>,
}

impl Credentials<'_> {
    /// `url` with the credentials and db added; a part it already carries is refused (which one
    /// is meant is not guessed). `name`: the option `url` came from.
    fn merge(&self, name: &str, url: &str) -> Result<String> {
        if self.username.is_none() && self.password.is_none() && self.db.is_none() {
            return Ok(url.to_string());
        }
        let Ok(mut u) = Url::parse(url) else {
            return bad(
                name,
                format!("is not a Redis URL: {:?}", crate::policy::redact_url(url)),
            );
        };
        let twice = |part: &str| {
            bad::<()>(
                &format!("redis.{part}"),
                format!("is given in `{name}` too: give it once"),
            )
        };
        if matches!(u.scheme(), "unix" | "redis+unix" | "valkey+unix") {
            let given: Vec<String> = u.query_pairs().map(|(k, _)| k.into_owned()).collect();
            let has = |k: &str| given.iter().any(|g| g == k);
            for (part, key, value) in [
                ("username", "user", self.username.map(str::to_string)),
                ("password", "pass", self.password.map(str::to_string)),
                ("db", "db", self.db.map(|d| d.to_string())),
            ] {
                if let Some(value) = value {
                    if has(key) {
                        twice(part)?;
                    }
                    u.query_pairs_mut().append_pair(key, &value);
                }
            }
            return Ok(u.to_string());
        }
        if let Some(user) = self.username {
            if !u.username().is_empty() {
                twice("username")?;
            }
            u.set_username(&escaped(user))
                .or_else(|_| bad(name, "cannot carry a user name"))?;
        }
        if let Some(password) = self.password {
            // `redis://name@host` carries a user name (as the redis crate reads it), no password.
            if u.password().is_some() {
                twice("password")?;
            }
            u.set_password(Some(&escaped(password)))
                .or_else(|_| bad(name, "cannot carry a password"))?;
        }
        if let Some(db) = self.db {
            if !u.path().trim_matches('/').is_empty() {
                twice("db")?;
            }
            u.set_path(&format!("/{db}"));
        }
        Ok(u.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(f: impl FnOnce(&mut RedisParts)) -> RedisParts {
        let mut p = RedisParts::default();
        f(&mut p);
        p
    }

    fn into_url(p: RedisParts, url: Option<&str>, tls: bool) -> Result<String> {
        let mut u = url.map(str::to_string);
        p.fold(Target::Url(&mut u), tls)?;
        Ok(u.unwrap())
    }

    #[test]
    fn parts_name_the_url_they_would() {
        let p = parts(|p| {
            p.host = Some("127.0.0.1".into());
            p.port = Some(6380.0);
            p.username = Some("app".into());
            p.password = Some("p@ss:w/rd%?#".into());
            p.db = Some(3.0);
        });
        assert_eq!(
            into_url(p, None, false).unwrap(),
            "redis://app:p%40ss%3Aw%2Frd%25%3F%23@127.0.0.1:6380/3"
        );
        let v6 = parts(|p| p.host = Some("::1".into()));
        assert_eq!(into_url(v6, None, true).unwrap(), "rediss://[::1]:6379");
        let alone = parts(|p| p.password = Some("pw".into()));
        assert_eq!(
            into_url(alone, None, false).unwrap(),
            "redis://:pw@localhost:6379"
        );
        let unix = parts(|p| {
            p.path = Some("/tmp/r s.sock".into());
            p.password = Some("a&b=c".into());
            p.db = Some(2.0);
        });
        assert_eq!(
            into_url(unix, None, false).unwrap(),
            "unix:///tmp/r%20s.sock?pass=a%26b%3Dc&db=2"
        );
        let plus = parts(|p| p.password = Some("pw".into()));
        assert_eq!(
            into_url(plus, Some("rediss://u@h:1"), false).unwrap(),
            "rediss://u:pw@h:1"
        );
    }

    #[test]
    fn a_part_given_twice_or_out_of_range_is_refused_by_name() {
        let named = |r: Result<String>, name: &str| {
            let e = r.unwrap_err();
            assert!(e.message.contains(&format!("`{name}`")), "{}", e.message);
            assert!(!e.message.contains("secret"), "{}", e.message);
        };
        for port in [0.0, 65_536.0, 1.5, f64::NAN, -1.0] {
            named(
                into_url(parts(|p| p.port = Some(port)), None, false),
                "redis.port",
            );
        }
        named(
            into_url(parts(|p| p.db = Some(-1.0)), None, false),
            "redis.db",
        );
        named(
            into_url(parts(|p| p.host = Some("a/b".into())), None, false),
            "redis.host",
        );
        named(
            into_url(parts(|p| p.path = Some("rel.sock".into())), None, false),
            "redis.path",
        );
        let pw = parts(|p| p.password = Some("x".into()));
        named(
            into_url(pw, Some("redis://:secret@h:1"), false),
            "redis.password",
        );
        named(
            into_url(parts(|p| p.db = Some(1.0)), Some("unix:///s?db=2"), false),
            "redis.db",
        );
        named(
            into_url(
                parts(|p| p.host = Some("h".into())),
                Some("redis://h:1"),
                false,
            ),
            "redis.host",
        );
        let mut seeds = vec!["redis://h:1".to_string()];
        let db = parts(|p| p.db = Some(1.0));
        let e = db.fold(Target::Cluster(&mut seeds), false).unwrap_err();
        assert!(e.message.contains("`redis.db`"));
        let pw = parts(|p| p.password = Some("pw".into()));
        pw.fold(Target::Cluster(&mut seeds), false).unwrap();
        assert_eq!(seeds, ["redis://:pw@h:1"]);
    }
}
