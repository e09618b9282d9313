//! The Redis tier: envelopes at `<ns>:v:{key}` (expiring at their hardTtl), one key per entry,
//! whose header's generation fences loads so that one begun before a `set` or `delete` is
//! dropped (`scripts/envelope.lua`), the cross-process lock protocol
//! around loads (`<ns>:lock:{key}`), the pub/sub bus that drops other processes' in-process
//! copies and wakes lock waiters, and the degrade-and-recover logic that keeps Redis trouble
//! from failing or blocking reads: every command is bounded by a timeout, and after an I/O
//! failure Redis is skipped at once (one probe at a time tries it again) until it answers.
//!
//! `deleteByTag`, `expireByTag` and `clear` touch no entry: they advance the namespace clock
//! (`<ns>:meta`) and record it at the tag's key (`<ns>:tag:{tag}`), its stale key
//! (`<ns>:stale:{tag}`) or as the clear clock; an entry born before a deletion or a clear is dead
//! wherever it is read, one born before an expireByTag stale (see `inbox.rs` and `tags.rs`).
//! `expire(key)` ends one envelope's freshness in place and changes its generation. Every Lua
//! script touches one cluster slot, but `tags.rs`'s one-step script on a single server, which
//! touches the meta hash and every tag's keys (all on that server).
//!
//! `RedisTier` (this file) is composed of parts that own their state and run no command:
//! - `Policies` (this file): the constructor's choices (namespace, serializer, lockTtl,
//!   tagTtl), fixed from `RedisTier::new`, so no call passes them;
//! - `health`: up or down, the probe's timing, whether stale copies are trusted;
//! - `bus`: the channel, this instance's origin, the messages' formats and what each heard one
//!   does to the inbox, the envelopes announcements carried (`carried`), and whether the first
//!   subscription attempt has ended;
//! - `lock`: the lock's life (lockTtl), the waiters here, and how long one bid may wait;
//! - `fence`: the clock fences are read by, and when one is too old to be written back;
//! - `reports` (the rate-limited `onError` queue), `scripts` (`scripts/*.lua`, each naming its
//!   KEYS/ARGV), `order` (one instance's writes in call order), `replay` (the changes Redis could
//!   not take, waiting: bounded, oldest first).
//!
//! The tier's work runs commands on its connection (`run`, here), so it is written as methods
//! of `RedisTier`, one file per concern: `envelopes` (reads and fenced writes), `gates` (the
//! lock bids and release, and the fence a load takes), `tags` (deleteByTag, expireByTag, clear,
//! and whether an entry read is still alive or stale), `batch` (many keys in one round trip), `subscriber` (the
//! bus's subscription loop), `sentinel` (following the master across failovers), `lane` (the
//! read lane the embedder's event loop drives). These methods call one another through
//! `self` (a write-back releases the lock, a gate reads the envelope); `replaying` (set,
//! delete, deleteByTag and clear taken at once or queued, and replayed); `verify` (the
//! in-process copies checked against Redis after a lost bus connection); their imports do not
//! go round.
//!
//! Imports run one way, from the tier down to the store, never back (check with
//! `grep -n "^use super::\|^use crate::" src/store/redis/*.rs src/store/redis/*/*.rs`):
//! 1. the tier's files import `RedisTier` from this file, the parts and anything below, and
//!    among themselves only downwards: `batch` → `gates` → `envelopes`; `tags` and `lane` →
//!    `envelopes`; `replaying` → `replay`, `tags`, `envelopes`; `verify` → `batch`; `subscriber`, `sentinel` → none of them;
//! 2. the parts import no tier file and no `RedisTier`: `bus` → `carried`; `health`, `lock`,
//!    `fence`, `reports`, `scripts`, `carried`, `order`, `replay` import nothing of this module;
//! 3. the connection: `connection` (making, replacing and classifying) → `topology`, `net`,
//!    `slots` (a Cluster's slot map, a leaf);
//! 4. the store: `topology` (where Redis is) → `guard` (guarded sockets), `net`, `target`;
//!    `lane/transport` → `target`, `lane/resp`; leaves: `net` (TCP settings, the timeout
//!    error), `target` (where a lane dials), `lane/resp`.
//!
//! The locking rule. Every `std::sync::Mutex` here is taken with `lock_or_recover`
//! (`crate::sync`), held for a few statements, never across an `.await`, and never while
//! another of them is taken, so no two can deadlock whatever the order:
//! - `Health` (`health`): up or down, and whether a probe is running;
//! - `Reports::log`: the failures waiting for `onError` and when each kind was last reported;
//! - `Waiters` (`lock`): the lock waiters by key (each woken after the lock is let go);
//! - `WriteOrder` (`order`): the queued writes by key;
//! - `Replay::state` (`replay`): the changes waiting for replay, and their keys;
//! - `Carried` (`carried`): the envelopes announcements carried;
//! - `Link::current` (`connection`): the shared command connection (it reads the topology's
//!   move count, a `watch`, under it);
//! - `Link::slots` (`connection`): a Cluster's slot map as a batch last read it;
//! - the topology's followed master (Sentinel);
//! - a lane's `Opened` slot, shared with the embedder's thread.
//!
//! Two `tokio::sync::Mutex`es are held across awaits by design, and only they: `Link::connecting`
//! for one connection attempt at a time (it takes `Link::current` and the followed master
//! inside, briefly), and the topology's Sentinel client for one lookup.

mod batch;
mod bus;
mod carried;
mod connection;
mod envelopes;
mod fence;
mod gates;
mod guard;
mod health;
mod hints;
mod lane;
mod lock;
mod net;
mod order;
mod replay;
mod replaying;
mod reports;
mod scripts;
mod sentinel;
mod slots;
mod subscriber;
mod tags;
mod target;
mod topology;
mod verify;

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Instant;

use redis::RedisResult;
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::envelope::{Fmt, Serializer};
use crate::inbox::{Inbox, Stamp};
use crate::key;
use crate::stats::Stats;

pub use batch::FirstLook;
pub use bus::channel;
pub use connection::{classify, Fault};
pub use envelopes::{new_token, Fetched, WriteBack};
pub use fence::Fence;
pub use gates::{Gate, HeldLock, LockOutcome};
pub use health::PROBE_INTERVAL;
pub use hints::explained;
pub use lane::{
    frame, frame_values, handshake_reply, Landing, LaneNode, LaneRead, LaneSocket, LaneStream,
    MarkRule, Opened,
};
pub use order::WriteOrder;
pub use replaying::{Applied, Change, Expected, Replaying, Taken};
pub use reports::{Outage, Report, Reports, REPORT_INTERVAL};
pub use tags::TagFailure;
pub use target::LaneTarget;
pub use topology::{RedisConfig, TlsOptions};

use bus::Bus;
use connection::Link;
use fence::Fences;
use health::{Admit, Health};
use lock::Lock;
use net::timed_out;
use scripts::Scripts;

/// An entry read from Redis.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    pub envelope: crate::envelope::Envelope,
    /// The value as JSON; `None` for a cached `undefined`.
    pub value_json: Option<String>,
    /// The key's invalidation stamp before the read was sent (see `Cache::adopt`).
    pub stamp: Stamp,
    pub tags: Vec<String>,
    /// How the value is written (this cache's serializer's, or it would not be found).
    pub fmt: Fmt,
}

/// What the constructor decided for this cache's use of Redis, fixed for the tier's life: the
/// tier keeps them from `RedisTier::new`, so no call passes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Policies {
    /// Prefixes every key this cache writes, and names its bus channel.
    pub namespace: String,
    /// Envelopes written by another serializer are misses.
    pub serializer: Serializer,
    /// `lockTtl`: how long a lock a load takes lives, and how long a waiter waits for one
    /// holder (at least 1 ms).
    pub lock_ttl_ms: u64,
    /// `tagTtl`: no entry carrying tags outlives it, so neither need a deleteByTag's record.
    pub tag_ttl_ms: u64,
}

/// Redis was skipped or failed; already counted and reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unavailable;

pub struct RedisTier {
    /// Itself, for the background tasks it spawns.
    me: Weak<RedisTier>,
    link: Link,
    /// Where background work runs (writes in order, probes).
    runtime: Handle,
    policies: Policies,
    stats: Arc<Stats>,
    inbox: Arc<Inbox>,
    /// Whether Redis and the bus are up, and the probe's timing.
    health: Health,
    /// What the bus says and hears.
    bus: Bus,
    /// The lock's life and who waits for it here.
    lock: Lock,
    order: Arc<WriteOrder>,
    /// The changes Redis could not take, waiting to be replayed.
    replay: replay::Replay<Change>,
    /// The time the last change was made at (see `change_time`).
    last_change_ms: std::sync::atomic::AtomicU64,
    /// Failures not yet handed to `onError` (shared with the embedder, which keeps draining it
    /// after the tier is gone).
    reports: Arc<Reports>,
    shutdown: watch::Sender<bool>,
    scripts: Scripts,
    /// The clock fences are read by.
    fences: Fences,
    /// The keys this process wrote to Redis (sets, deletes, expires, write-backs): a read lane
    /// marks the first read of one after it wrote it (see `lane::Written`).
    written: lane::Written,
}

impl RedisTier {
    /// Prepares the tier for `config` (a URL, TLS material or a topology the redis crate
    /// refuses is an error that says why) under `policies`; `connect` and `run_bus` (spawned
    /// by the embedder on `runtime`) connect.
    pub fn new(
        config: &RedisConfig,
        policies: Policies,
        stats: Arc<Stats>,
        inbox: Arc<Inbox>,
        runtime: Handle,
    ) -> Result<Arc<Self>, String> {
        let link = Link::new(topology::Topology::new(config)?);
        let channel = channel(&policies.namespace, link.topology.db());
        let (shutdown, _) = watch::channel(false);
        let lock = Lock::new(policies.lock_ttl_ms);
        Ok(Arc::new_cyclic(|me| RedisTier {
            me: me.clone(),
            link,
            runtime,
            policies,
            bus: Bus::new(channel, new_token(), inbox.clone()),
            stats,
            inbox: inbox.clone(),
            health: Health::new(inbox),
            lock,
            order: Arc::new(WriteOrder::default()),
            replay: replay::Replay::default(),
            last_change_ms: std::sync::atomic::AtomicU64::new(0),
            reports: Arc::new(Reports::default()),
            shutdown,
            scripts: Scripts::new(),
            fences: Fences::new(),
            written: lane::Written::default(),
        }))
    }

    /// Makes the first connection ahead of the first call (calls made meanwhile share it), and
    /// under Sentinel starts following the master (`sentinel.rs`).
    pub async fn connect(&self) {
        if let (true, Some(me)) = (self.link.topology.is_sentinel(), self.me.upgrade()) {
            self.runtime.spawn(me.follow_master());
        }
        if let Err(e) = self.connection(Instant::now()).await {
            self.health.first_connection_failed();
            self.stats.redis_errors.incr();
            self.reports
                .went_down("connect", None, format!("Redis connection failed: {e}"));
        }
    }

    /// Stops the bus, wakes every lock waiter (they end with `Gate::Closed`) and drops the changes
    /// waiting for replay. The locks that
    /// loads still running hold are released as their `HeldLock`s drop, after the writes already
    /// queued for their keys. The connection closes once the last task holding the tier ends.
    pub fn close(&self) {
        self.shutdown.send_replace(true);
        self.lock.wake_all();
        // The changes waiting for replay go; a caller waiting behind them is answered now.
        drop(self.replay.take_all());
    }

    pub fn closed(&self) -> bool {
        *self.shutdown.borrow()
    }

    pub fn value_key(&self, key: &str) -> String {
        key::redis_value_key(&self.policies.namespace, key)
    }

    pub fn lock_key(&self, key: &str) -> String {
        key::redis_lock_key(&self.policies.namespace, key)
    }

    /// The generation key earlier versions fenced loads by (`set` and `delete` remove it, so
    /// their loads running during a rolling deploy are dropped too; see `write.lua`).
    pub fn generation_key(&self, key: &str) -> String {
        key::redis_generation_key(&self.policies.namespace, key)
    }

    pub fn tag_key(&self, tag: &str) -> String {
        key::redis_tag_key(&self.policies.namespace, tag)
    }

    pub fn tag_stale_key(&self, tag: &str) -> String {
        key::redis_tag_stale_key(&self.policies.namespace, tag)
    }

    pub fn meta_key(&self) -> String {
        key::redis_meta_key(&self.policies.namespace)
    }

    /// Runs `job` after this instance's earlier writes of `key` (and earlier namespace-wide
    /// ones).
    pub fn in_order<F>(&self, key: &str, job: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.order.push(&self.runtime, key, Box::pin(job));
    }

    /// Runs `job` (a `deleteByTag` or `clear`) after every earlier write of this instance;
    /// later writes wait for it.
    pub fn in_order_global<F>(&self, job: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.order.push_global(&self.runtime, Box::pin(job));
    }

    /// The connection, once the first subscription attempt has ended (so nothing is cached
    /// before the bus could announce changes to it).
    async fn connection(&self, started: Instant) -> RedisResult<connection::Conn> {
        if let Some(mut attempted) = self.bus.attempt() {
            let _ =
                tokio::time::timeout(self.link.connect_timeout, until_true(&mut attempted)).await;
        }
        if started.elapsed() >= self.link.connect_timeout {
            return Err(timed_out("timed out connecting to Redis"));
        }
        self.link.get(started).await
    }

    /// May a command go to Redis now? Only while it is up. While it is down, the first call
    /// after `retry_at` (or `probe_at`'s timer) starts the background probe and, like every
    /// other, skips Redis.
    fn admit(&self, op: &'static str) -> bool {
        // A closed cache still releases the locks its last loads hold, so other processes do
        // not wait out lockTtl.
        if self.closed() && op != "unlock" {
            return false;
        }
        match self.health.admit() {
            Admit::Go => true,
            Admit::Skip => false,
            Admit::Probe => {
                if let Some(me) = self.me.upgrade() {
                    self.runtime.spawn(async move { me.probe().await });
                }
                false
            }
        }
    }

    /// Pings Redis on a fresh connection if the last one failed; up again on an answer.
    async fn probe(&self) {
        let started = Instant::now();
        let mut used = None;
        let answered = async {
            let conn = self.connection(started).await?;
            used = Some(conn.id);
            redis::cmd("PING")
                .query_async::<String>(&mut conn.inner.clone())
                .await
        };
        match tokio::time::timeout(self.link.command_timeout, answered).await {
            Ok(Ok(_)) => self.succeeded(),
            outcome => {
                if let Some(id) = used {
                    self.link.replace(id);
                }
                let why = match outcome {
                    Ok(Err(e)) => format!("Redis is still unavailable: {e}"),
                    _ => "Redis is still unavailable: PING timed out".to_string(),
                };
                self.went_down("probe", None, why);
            }
        }
    }

    fn succeeded(&self) {
        self.health.succeeded();
        self.reports.answered();
        self.kick_replay();
    }

    fn went_down(&self, op: &'static str, key: Option<&str>, message: String) {
        self.stats.redis_errors.incr();
        let retry_at = self.health.went_down();
        self.reports.went_down(op, key, message);
        self.probe_at(retry_at);
    }

    /// Starts the probe at `at` (unless a call started one, or Redis is up again) whether or
    /// not a call comes. Waiting for a call would leave an idle process that lost a connection
    /// (killed, or through a failover while Redis stayed up) down however long it idles, and
    /// that call, skipping Redis, would load without a fence: its result never written back.
    /// Holds no strong reference while it waits: a dropped tier is not probed.
    fn probe_at(&self, at: Instant) {
        let me = self.me.clone();
        self.runtime.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            if let Some(me) = me.upgrade() {
                // Down: starts the probe if none runs; up, or closed: does nothing.
                let _ = me.admit("probe");
            }
        });
    }

    pub fn bus_up(&self) -> bool {
        self.health.bus_up()
    }

    /// Queues a failure for `onError` (rate-limited).
    /// A reply on the command connection named another key than the one asked for (see
    /// `envelopes::Misdelivered`): counted and reported, and the connection is replaced, since
    /// whatever else it carries may be shifted too. Redis is not taken down for it.
    pub(super) fn misdelivered(&self, op: &'static str, key: &str) {
        if let Some(conn) = self.link.current() {
            self.link.replace(conn.id);
        }
        self.stats.redis_errors.incr();
        self.report(
            op,
            (!key.is_empty()).then_some(key),
            "Redis's replies are out of step with its requests (another key's entry, or a reply \
             moved): the connection is replaced"
                .to_string(),
        );
    }

    fn report(&self, op: &'static str, key: Option<&str>, message: String) {
        self.reports.push(op, key, message);
    }

    pub fn take_reports(&self) -> Vec<Report> {
        self.reports.take()
    }

    /// Failures wait for `onError` (see `Reports::waiting`).
    pub fn reports_waiting(&self) -> bool {
        self.reports.waiting()
    }

    /// The failure queue, for draining after the tier is closed and gone.
    pub fn reports(&self) -> Arc<Reports> {
        self.reports.clone()
    }

    /// Runs one bounded command. An I/O failure or timeout replaces the connection and marks
    /// Redis down; READONLY and the like replace the connection and fail this command alone;
    /// other error replies fail this command alone. Every failure is counted and reported.
    async fn run<T, F, Fut>(&self, op: &'static str, key: &str, f: F) -> Result<T, Unavailable>
    where
        F: FnOnce(topology::Connection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        if !self.admit(op) {
            return Err(Unavailable);
        }
        // Namespace-wide operations name no key.
        let key = (!key.is_empty()).then_some(key);
        let conn = match self.connection(Instant::now()).await {
            Ok(c) => c,
            Err(e) => {
                self.went_down(op, key, format!("Redis connection failed: {e}"));
                return Err(Unavailable);
            }
        };
        let id = conn.id;
        match tokio::time::timeout(self.link.command_timeout, f(conn.inner)).await {
            Ok(Ok(v)) => {
                self.succeeded();
                Ok(v)
            }
            Ok(Err(e)) => {
                let message = format!("Redis {op} failed: {e}");
                match classify(&e) {
                    Fault::Down => {
                        self.link.replace(id);
                        self.went_down(op, key, message);
                    }
                    Fault::Reconnect => {
                        self.link.replace(id);
                        self.stats.redis_errors.incr();
                        self.report(op, key, message);
                    }
                    Fault::Command => {
                        self.stats.redis_errors.incr();
                        self.report(op, key, message);
                    }
                }
                Err(Unavailable)
            }
            Err(_) => {
                // Never reused: whatever it still carries is abandoned with it.
                self.link.replace(id);
                self.went_down(
                    op,
                    key,
                    format!("Redis {op} timed out after {:?}", self.link.command_timeout),
                );
                Err(Unavailable)
            }
        }
    }

    /// A `get` answered without Redis (a carried envelope) is still an l2Hit.
    pub fn count_l2_hit(&self) {
        self.stats.l2_hits.incr();
    }

    /// A batch read's key that Redis did not have (for `getMany`) is a miss.
    pub fn count_miss(&self) {
        self.stats.misses.incr();
    }

    /// Lock waiters registered now (for tests: none may be left behind).
    pub fn waiting_keys(&self) -> usize {
        self.lock.waiting_keys()
    }

    /// Writes queued or running (for tests: none may be left behind).
    pub fn pending_writes(&self) -> usize {
        self.order.pending()
    }

    /// A write of `key` by this instance is queued or unanswered (see `WriteOrder::busy`).
    pub fn writing(&self, key: &str) -> bool {
        self.order.busy(key) || self.replay.holds(key)
    }
}

/// Resolves once the flag is set (`close` called, first subscription attempted, ...).
pub(crate) async fn until_true(rx: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, not held across the caller's awaits.
    let _set = rx.wait_for(|set| *set).await.is_ok();
}
