//! The Redis tier: envelopes at `<ns>:v:{key}` (expiring at their hardTtl), the cross-process
//! lock protocol around loads, the pub/sub bus that drops other processes' in-process copies and
//! wakes lock waiters, and the degrade-and-recover logic that keeps Redis trouble from failing or
//! blocking reads: every command is bounded by a timeout, and after a failure Redis is skipped
//! at once (one probe at a time tries it again) until it answers.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, RedisResult, Script};
use tokio::sync::{watch, Notify};

use crate::clock::{Clock, SystemClock};
use crate::envelope::{Envelope, State};
use crate::inbox::{Inbox, Stamp};
use crate::key;
use crate::lock;
use crate::stats::Stats;

/// How long the first connection may take before calls degrade.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A command not answered within this counts as a Redis error.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// After a failure, Redis is skipped this long before a background probe tries it again.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);
/// The bus pings this often when no message arrives, to notice a Redis that stopped answering.
pub const BUS_PING_INTERVAL: Duration = Duration::from_secs(1);
/// At most one `onError` report per operation kind per this interval.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// While the bus is down, lock waiters look again this often (no notification can come).
const POLL_WITHOUT_BUS: Duration = Duration::from_millis(100);

/// Writes an envelope, releases the writer's lock if it still holds it, and announces the key.
/// KEYS[1] value key, KEYS[2] lock key; ARGV[1] envelope, ARGV[2] px, ARGV[3] token or '',
/// ARGV[4] channel, ARGV[5] message.
const STORE_LUA: &str = r"
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
";

/// Replaces an envelope only if it is still the one read (compare-and-set), keeping its expiry.
/// KEYS[1] value key; ARGV[1] expected, ARGV[2] replacement.
const REPLACE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  return 1
end
return 0
";

/// An entry read from Redis.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    pub envelope: Envelope,
    /// The value as JSON; `None` for a cached `undefined`.
    pub value_json: Option<String>,
    /// The key's invalidation stamp before the read was sent (see `Cache::adopt`).
    pub stamp: Stamp,
}

/// What a load should do after asking Redis.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// Redis has the entry (another process wrote it): use it.
    Found(Remote),
    /// Call the loader: holding the lock (`Some(token)`), or without it (Redis unavailable, or
    /// no value came within lockTtl).
    Lead(Option<String>),
    /// Another process is refreshing the key: keep serving what we have.
    Skip,
}

/// A read of one key.
#[derive(Debug, Clone, PartialEq)]
pub enum Fetched {
    Found(Remote),
    Missing,
    Unavailable,
}

/// A background failure for `onError`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub op: &'static str,
    pub key: Option<String>,
    pub message: String,
}

/// Redis was skipped or failed; already counted and reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

#[derive(Debug)]
enum Health {
    Up,
    /// Failed; skipped until `retry_at`, then one call (`probing`) tries it.
    Down {
        retry_at: Instant,
        probing: bool,
    },
}

pub struct RedisTier {
    /// Itself, for the background probe it spawns.
    me: Weak<RedisTier>,
    client: redis::Client,
    /// The command connection, made once (concurrent first calls share one attempt);
    /// ConnectionManager reconnects by itself after errors.
    conn: Mutex<Option<ConnectionManager>>,
    /// Held while making the connection, so concurrent first calls share one attempt.
    connecting: tokio::sync::Mutex<()>,
    namespace: String,
    channel: String,
    /// Names this cache instance on the bus, so it ignores its own announcements.
    origin: String,
    stats: Arc<Stats>,
    inbox: Arc<Inbox>,
    health: Mutex<Health>,
    bus_up: AtomicBool,
    /// Set once the first subscription attempt has ended (either way): the first commands wait
    /// for it, so nothing is cached before the bus could announce changes to it.
    bus_attempted: watch::Sender<bool>,
    /// Lock waiters by key, woken when the bus announces the key.
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    /// Failures not yet handed to `onError`, with when each kind was last reported.
    reports: Mutex<ReportLog>,
    shutdown: watch::Sender<bool>,
    store_script: Script,
    release_script: Script,
    replace_script: Script,
}

#[derive(Default)]
struct ReportLog {
    queue: VecDeque<Report>,
    last: HashMap<&'static str, Instant>,
}

impl RedisTier {
    /// Parses the URL (an error names what is wrong) and prepares the tier; `start` connects.
    pub fn new(
        url: &str,
        namespace: &str,
        stats: Arc<Stats>,
        inbox: Arc<Inbox>,
    ) -> Result<Arc<Self>, String> {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let (shutdown, _) = watch::channel(false);
        let (bus_attempted, _) = watch::channel(false);
        Ok(Arc::new_cyclic(|me| RedisTier {
            me: me.clone(),
            client,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            namespace: namespace.to_string(),
            channel: key::bus_channel(namespace),
            origin: lock::new_token(),
            stats,
            inbox,
            // Up until proven otherwise: the first calls wait for the first connection.
            health: Mutex::new(Health::Up),
            bus_up: AtomicBool::new(false),
            bus_attempted,
            waiters: Mutex::new(HashMap::new()),
            reports: Mutex::new(ReportLog::default()),
            shutdown,
            store_script: Script::new(STORE_LUA),
            release_script: Script::new(lock::RELEASE_LUA),
            replace_script: Script::new(REPLACE_LUA),
        }))
    }

    /// Makes the first connection ahead of the first call (spawn it at construction; calls made
    /// meanwhile share the same attempt).
    pub async fn connect(&self) {
        if self.connection().await.is_err() {
            // Counted and reported as calls find it down; the first call probes again.
            let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
            *h = Health::Down {
                retry_at: Instant::now(),
                probing: false,
            };
        }
    }

    /// Stops the bus and drops the command connection; later commands are refused, but for
    /// releasing the locks the last loads hold.
    pub fn close(&self) {
        self.shutdown.send_replace(true);
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn closed(&self) -> bool {
        *self.shutdown.borrow()
    }

    pub fn value_key(&self, key: &str) -> String {
        key::redis_value_key(&self.namespace, key)
    }

    pub fn lock_key(&self, key: &str) -> String {
        key::redis_lock_key(&self.namespace, key)
    }

    fn announcement(&self, key: &str) -> String {
        format!("{} {key}", self.origin)
    }

    fn current_connection(&self) -> Option<ConnectionManager> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The command connection, made on first use within CONNECT_TIMEOUT (concurrent first
    /// calls share one attempt); ConnectionManager reconnects by itself after errors. After
    /// `close`, a connection made for a last lock release is used once and not kept.
    async fn connection(&self) -> RedisResult<ConnectionManager> {
        if let Some(c) = self.current_connection() {
            return Ok(c);
        }
        let started = Instant::now();
        let timed_out = || {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "timed out connecting to Redis",
            ))
        };
        if !*self.bus_attempted.borrow() {
            let mut attempted = self.bus_attempted.subscribe();
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, until_true(&mut attempted)).await;
        }
        let left = || {
            CONNECT_TIMEOUT
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(50))
        };
        let _connecting = tokio::time::timeout(left(), self.connecting.lock())
            .await
            .map_err(|_| timed_out())?;
        if let Some(c) = self.current_connection() {
            return Ok(c);
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(PROBE_INTERVAL);
        let made = ConnectionManager::new_with_config(self.client.clone(), config);
        let conn = tokio::time::timeout(left(), made)
            .await
            .map_err(|_| timed_out())??;
        if !self.closed() {
            *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn.clone());
        }
        Ok(conn)
    }

    /// May a command go to Redis now? Only while it is up. While it is down, the first call
    /// after `retry_at` starts the background probe and, like every other, skips Redis.
    fn admit(&self, op: &'static str) -> bool {
        // A closed cache still releases the locks its last loads hold, so other processes do
        // not wait out lockTtl.
        if self.closed() && op != "unlock" {
            return false;
        }
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *h {
            Health::Up => true,
            Health::Down { retry_at, probing } => {
                if !*probing && Instant::now() >= *retry_at {
                    *probing = true;
                    if let Some(me) = self.me.upgrade() {
                        tokio::spawn(async move { me.probe().await });
                    }
                }
                false
            }
        }
    }

    /// Pings Redis; up again on an answer, else the next probe waits PROBE_INTERVAL.
    async fn probe(&self) {
        let answered = async {
            let mut conn = self.connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        match tokio::time::timeout(COMMAND_TIMEOUT, answered).await {
            Ok(Ok(_)) => self.succeeded(),
            outcome => {
                let why = match outcome {
                    Ok(Err(e)) => format!("Redis is still unavailable: {e}"),
                    _ => format!(
                        "Redis is still unavailable: PING timed out after {COMMAND_TIMEOUT:?}"
                    ),
                };
                self.failed("probe", None, why);
            }
        }
    }

    fn succeeded(&self) {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(*h, Health::Up) {
            *h = Health::Up;
            drop(h);
            self.update_trust();
        }
    }

    fn failed(&self, op: &'static str, key: Option<&str>, message: String) {
        self.stats.redis_errors.incr();
        {
            let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
            *h = Health::Down {
                retry_at: Instant::now() + PROBE_INTERVAL,
                probing: false,
            };
        }
        self.update_trust();
        self.report(op, key, message);
    }

    fn redis_up(&self) -> bool {
        matches!(
            *self.health.lock().unwrap_or_else(|p| p.into_inner()),
            Health::Up
        )
    }

    pub fn bus_up(&self) -> bool {
        self.bus_up.load(Ordering::Relaxed)
    }

    /// Stale in-process copies are served unless invalidations may be missed while Redis
    /// could be asked instead (bus down, Redis up). With Redis down they are all we have.
    fn update_trust(&self) {
        self.inbox
            .set_trust_stale(self.bus_up() || !self.redis_up());
    }

    /// Queues a failure for `onError`, at most one per operation kind per REPORT_INTERVAL.
    fn report(&self, op: &'static str, key: Option<&str>, message: String) {
        let mut log = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if log
            .last
            .get(op)
            .is_some_and(|t| now.duration_since(*t) < REPORT_INTERVAL)
        {
            return;
        }
        log.last.insert(op, now);
        if log.queue.len() >= 64 {
            log.queue.pop_front();
        }
        log.queue.push_back(Report {
            op,
            key: key.map(str::to_string),
            message,
        });
    }

    pub fn take_reports(&self) -> Vec<Report> {
        let mut log = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        log.queue.drain(..).collect()
    }

    /// Runs one bounded command; failures are counted, reported and mark Redis down.
    async fn run<T, F, Fut>(&self, op: &'static str, key: &str, f: F) -> Result<T, Unavailable>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        if !self.admit(op) {
            return Err(Unavailable);
        }
        let conn = match self.connection().await {
            Ok(c) => c,
            Err(e) => {
                self.failed(op, Some(key), format!("Redis connection failed: {e}"));
                return Err(Unavailable);
            }
        };
        match tokio::time::timeout(COMMAND_TIMEOUT, f(conn)).await {
            Ok(Ok(v)) => {
                self.succeeded();
                Ok(v)
            }
            Ok(Err(e)) => {
                self.failed(op, Some(key), format!("Redis {op} failed: {e}"));
                Err(Unavailable)
            }
            Err(_) => {
                self.failed(
                    op,
                    Some(key),
                    format!("Redis {op} timed out after {COMMAND_TIMEOUT:?}"),
                );
                Err(Unavailable)
            }
        }
    }

    /// Reads the key's envelope. Anything this library did not write (other JSON, another Redis
    /// type, bytes that are not UTF-8) is a miss.
    pub async fn fetch(&self, key: &str) -> Fetched {
        let vkey = self.value_key(key);
        let stamp = self.inbox.stamp(key);
        let raw = self
            .run("get", key, |mut c| async move {
                match redis::cmd("GET")
                    .arg(&vkey)
                    .query_async::<Option<Vec<u8>>>(&mut c)
                    .await
                {
                    Err(e) if e.code() == Some("WRONGTYPE") => Ok(None),
                    other => other,
                }
            })
            .await;
        match raw {
            Err(Unavailable) => Fetched::Unavailable,
            Ok(None) => Fetched::Missing,
            Ok(Some(bytes)) => {
                let now = SystemClock.now_ms();
                match std::str::from_utf8(&bytes).ok().and_then(Envelope::decode) {
                    Some(d) if d.envelope.state(now) != State::Expired => Fetched::Found(Remote {
                        envelope: d.envelope,
                        value_json: d.value_json.map(str::to_string),
                        stamp,
                    }),
                    _ => Fetched::Missing,
                }
            }
        }
    }

    /// SET NX PX on the key's lock; true when `token` now holds it.
    async fn try_lock(
        &self,
        key: &str,
        lkey: &str,
        token: &str,
        ttl_ms: u64,
    ) -> Result<bool, Unavailable> {
        self.run("lock", key, |mut c| async move {
            lock::acquire(&mut c, lkey, token, ttl_ms).await
        })
        .await
    }

    /// A cold load's way through Redis: the value if another process has it; else take the
    /// lock and load (re-checking Redis first); else wait, woken by the bus, for the holder's
    /// value. A lock that expires is taken over by one waiter (one extra load, at worst); the
    /// others wait for that holder in turn. Only when no value has come within lockTtl and the
    /// lock cannot be had (three lock lives at most) does a waiter load without it.
    pub async fn cold_gate(&self, key: &str, lock_ttl_ms: u64) -> Gate {
        let lkey = self.lock_key(key);
        let token = lock::new_token();
        let lock_ttl = Duration::from_millis(lock_ttl_ms);
        let started = Instant::now();
        let give_up = started + 3 * lock_ttl;
        let mut deadline = started + lock_ttl;
        let mut waited = false;
        loop {
            // Registered before looking, so an announcement between the look and the wait
            // still wakes us.
            let waiter = self.waiter(key);
            let notified = waiter.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();

            match self.fetch(key).await {
                Fetched::Found(r) => return Gate::Found(r),
                Fetched::Unavailable => return Gate::Lead(None),
                Fetched::Missing => {}
            }
            match self.try_lock(key, &lkey, &token, lock_ttl_ms).await {
                Err(Unavailable) => return Gate::Lead(None),
                Ok(true) => {
                    self.stats.lock_wins.incr();
                    // The previous holder may have written just before we took the lock.
                    return match self.fetch(key).await {
                        Fetched::Found(r) => {
                            self.release(key, &token, false).await;
                            Gate::Found(r)
                        }
                        _ => Gate::Lead(Some(token)),
                    };
                }
                Ok(false) => {}
            }
            if !waited {
                waited = true;
                self.stats.lock_waits.incr();
            }
            let lock_left = self
                .run("lock", key, |mut c| {
                    let lkey = lkey.clone();
                    async move { lock::remaining_ms(&mut c, &lkey).await }
                })
                .await;
            let lock_left = match lock_left {
                Err(Unavailable) => return Gate::Lead(None),
                // Released in between: look again at once.
                Ok(None) => continue,
                Ok(Some(ms)) => Duration::from_millis(ms + 1),
            };
            let now = Instant::now();
            if now >= deadline {
                // The holder we waited for is gone and another process holds the lock now:
                // wait for that one (it loads), but never past `give_up`.
                if now >= give_up {
                    return Gate::Lead(None);
                }
                deadline = (now + lock_left).min(give_up);
            }
            let mut wait = (deadline - now).min(lock_left);
            if !self.bus_up() {
                wait = wait.min(POLL_WITHOUT_BUS);
            }
            let _ = tokio::time::timeout(wait, notified).await;
        }
    }

    /// A background refresh's way through Redis: only the lock holder refreshes; it re-checks
    /// first, in case another process has just refreshed (the Redis copy is newer than ours,
    /// `local_fresh_until`) or recorded a failure (error backoff). An XFetch refresh starts
    /// while the entry is still fresh, so freshness alone does not mean someone refreshed.
    pub async fn refresh_gate(&self, key: &str, lock_ttl_ms: u64, local_fresh_until: f64) -> Gate {
        let lkey = self.lock_key(key);
        let token = lock::new_token();
        match self.try_lock(key, &lkey, &token, lock_ttl_ms).await {
            Err(Unavailable) => Gate::Lead(None),
            Ok(false) => Gate::Skip,
            Ok(true) => {
                self.stats.lock_wins.incr();
                let now = SystemClock.now_ms();
                match self.fetch(key).await {
                    Fetched::Found(r)
                        if r.envelope.fresh_until > local_fresh_until
                            || !r.envelope.refresh_allowed(now) =>
                    {
                        self.release(key, &token, false).await;
                        Gate::Found(r)
                    }
                    _ => Gate::Lead(Some(token)),
                }
            }
        }
    }

    /// Writes an envelope with its remaining life as expiry, releases `token`'s lock and
    /// announces the key, in one round trip. False when Redis was unavailable.
    pub async fn store(
        &self,
        key: &str,
        envelope: &Envelope,
        value_json: Option<&str>,
        token: Option<&str>,
    ) -> bool {
        let px = envelope.remaining_ms(SystemClock.now_ms());
        let text = envelope.encode(value_json);
        let (vkey, lkey, msg) = (
            self.value_key(key),
            self.lock_key(key),
            self.announcement(key),
        );
        let token = token.unwrap_or("").to_string();
        self.run("set", key, |mut c| async move {
            self.store_script
                .key(&vkey)
                .key(&lkey)
                .arg(&text)
                .arg(px)
                .arg(&token)
                .arg(&self.channel)
                .arg(&msg)
                .invoke_async::<i64>(&mut c)
                .await
        })
        .await
        .is_ok()
    }

    /// Releases `token`'s lock; `announce` wakes the processes waiting on it (a failed cold load).
    pub async fn release(&self, key: &str, token: &str, announce: bool) {
        let (lkey, msg) = (self.lock_key(key), self.announcement(key));
        let _ = self
            .run("unlock", key, |mut c| async move {
                let announce = announce.then_some((self.channel.as_str(), msg.as_str()));
                lock::release(&mut c, &self.release_script, &lkey, token, announce).await
            })
            .await;
    }

    /// A background refresh failed: record `retry_after` in the Redis envelope, so no process
    /// refreshes the key again before then, and release the lock.
    pub async fn record_failure(&self, key: &str, token: Option<&str>, retry_after: f64) {
        let vkey = self.value_key(key);
        let current = self
            .run("get", key, |mut c| {
                let vkey = vkey.clone();
                async move {
                    match redis::cmd("GET")
                        .arg(&vkey)
                        .query_async::<Option<String>>(&mut c)
                        .await
                    {
                        Err(e) if e.code() == Some("WRONGTYPE") => Ok(None),
                        other => other,
                    }
                }
            })
            .await;
        if let Ok(Some(text)) = current {
            if let Some(d) = Envelope::decode(&text) {
                let mut envelope = d.envelope;
                envelope.retry_after = envelope.retry_after.max(retry_after);
                let replacement = envelope.encode(d.value_json);
                let _ = self
                    .run("set", key, |mut c| async move {
                        self.replace_script
                            .key(&vkey)
                            .arg(&text)
                            .arg(&replacement)
                            .invoke_async::<i64>(&mut c)
                            .await
                    })
                    .await;
            }
        }
        if let Some(token) = token {
            self.release(key, token, false).await;
        }
    }

    /// Deletes the key and announces it. `None` when Redis was unavailable.
    pub async fn delete(&self, key: &str) -> Option<bool> {
        let (vkey, msg) = (self.value_key(key), self.announcement(key));
        self.run("delete", key, |mut c| async move {
            let (removed, _): (i64, i64) = redis::pipe()
                .cmd("DEL")
                .arg(&vkey)
                .cmd("PUBLISH")
                .arg(&self.channel)
                .arg(&msg)
                .query_async(&mut c)
                .await?;
            Ok(removed > 0)
        })
        .await
        .ok()
    }

    fn waiter(&self, key: &str) -> Waiter<'_> {
        let mut map = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        let notify = map.entry(key.to_string()).or_default().clone();
        Waiter {
            tier: self,
            key: key.to_string(),
            notify,
        }
    }

    /// Lock waiters registered now (for tests: none may be left behind).
    pub fn waiting_keys(&self) -> usize {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn on_announcement(&self, payload: &[u8]) {
        let Ok(text) = std::str::from_utf8(payload) else {
            return;
        };
        let Some((origin, key)) = text.split_once(' ') else {
            return;
        };
        if origin != self.origin {
            self.inbox.invalidate(key);
        }
        let notify = self
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned();
        if let Some(n) = notify {
            n.notify_waiters();
        }
    }

    fn set_bus_up(&self, up: bool) {
        self.bus_up.store(up, Ordering::Relaxed);
        self.update_trust();
    }

    /// The subscriber: one connection per cache, resubscribing by itself. Each (re)subscription
    /// drops every in-process copy, since announcements may have been missed meanwhile.
    pub async fn run_bus(self: Arc<Self>) {
        let mut shutdown = self.shutdown.subscribe();
        let mut backoff = Duration::from_millis(50);
        let mut first = true;
        while !self.closed() {
            let subscribed = tokio::time::timeout(CONNECT_TIMEOUT, async {
                let mut pubsub = self.client.get_async_pubsub().await?;
                pubsub.subscribe(&self.channel).await?;
                RedisResult::Ok(pubsub)
            })
            .await;
            // Calls waiting for the first attempt go on now, whatever its outcome.
            let first_succeeded = first && matches!(subscribed, Ok(Ok(_)));
            first = false;
            self.bus_attempted.send_replace(true);
            match subscribed {
                Ok(Ok(pubsub)) => {
                    backoff = Duration::from_millis(50);
                    // Copies made before this subscription may have missed announcements,
                    // unless it is the first one, which every Redis command waited for.
                    if !first_succeeded {
                        self.inbox.invalidate_all();
                    }
                    self.set_bus_up(true);
                    let (mut sink, mut stream) = pubsub.split();
                    loop {
                        tokio::select! {
                            _ = until_true(&mut shutdown) => {
                                self.set_bus_up(false);
                                return;
                            }
                            msg = stream.next() => match msg {
                                Some(msg) => self.on_announcement(msg.get_payload_bytes()),
                                None => break,
                            },
                            _ = tokio::time::sleep(BUS_PING_INTERVAL) => {
                                let pong = tokio::time::timeout(COMMAND_TIMEOUT, sink.ping::<redis::Value>()).await;
                                if !matches!(pong, Ok(Ok(_))) {
                                    break;
                                }
                            }
                        }
                    }
                    self.set_bus_up(false);
                    self.stats.redis_errors.incr();
                    self.report(
                        "bus",
                        None,
                        "Redis bus connection lost; resubscribing".to_string(),
                    );
                }
                Ok(Err(e)) => {
                    self.stats.redis_errors.incr();
                    self.report("bus", None, format!("Redis bus subscription failed: {e}"));
                }
                Err(_) => {
                    self.stats.redis_errors.incr();
                    self.report("bus", None, "Redis bus subscription timed out".to_string());
                }
            }
            tokio::select! {
                _ = until_true(&mut shutdown) => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

/// Resolves once the flag is set (`close` called, first subscription attempted, ...).
async fn until_true(rx: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, not held across the caller's awaits.
    let _set = rx.wait_for(|set| *set).await.is_ok();
}

/// A registered lock waiter; the last one of a key removes the key's entry.
struct Waiter<'a> {
    tier: &'a RedisTier,
    key: String,
    notify: Arc<Notify>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut map = self.tier.waiters.lock().unwrap_or_else(|p| p.into_inner());
        // Ours plus the map's: nobody else waits on this key.
        if Arc::strong_count(&self.notify) == 2 {
            map.remove(&self.key);
        }
    }
}
