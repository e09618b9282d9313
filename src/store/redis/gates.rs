//! The gates a load passes before calling the loader, on the tier's connection: the
//! cross-process lock (`SET <ns>:lock:{key} <token> NX PX <lockTtl>`, released by a
//! compare-and-delete so a holder whose lock expired never deletes the next holder's; its life,
//! waiters and patience are the `lock` part's), and the fence the load takes with it (the
//! `fence` part: the key's state as the load began; `write_back.lua` drops the result if it
//! changed). The lock is an efficiency lock (it saves loads); the fence is what keeps an older
//! value from winning.

use std::sync::Arc;
use std::time::Instant;

use redis::Value;

use super::envelopes::{int, invoke_marked, new_token, next_echo, usable, Fetched, Misdelivered};
use super::fence::{Fence, GENERATION_TTL};
use super::lock::{ClockRead, Patience};
use super::{RedisTier, Remote, Unavailable};
use crate::clock::{Clock, SystemClock};
use crate::envelope::{new_generation, Envelope};
use crate::inbox::Stamp;

/// A lock this instance holds for a running load: released (and announced, so waiters take
/// over at once) when dropped, unless `take`n by what releases it itself (a write-back, a
/// failure's record). A load that ends any other way (its cache closed or collected, its
/// record dropped on an error) so never leaves the lock to its TTL.
pub struct HeldLock {
    tier: Arc<RedisTier>,
    key: String,
    token: Option<String>,
}

impl HeldLock {
    pub fn new(tier: Arc<RedisTier>, key: String, token: String) -> Self {
        HeldLock {
            tier,
            key,
            token: Some(token),
        }
    }

    /// The token, for a release of the caller's own; the drop then releases nothing.
    pub fn take(mut self) -> String {
        self.token.take().expect("taken only once, by value")
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let tier = self.tier.clone();
        let key = self.key.clone();
        // After this instance's earlier writes of the key, as every release is.
        self.tier.in_order(&self.key, async move {
            tier.release(&key, &token, true).await;
        });
    }
}

/// What a load should do after asking Redis.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// Redis has the entry (another process wrote it): use it.
    Found(Remote),
    /// Call the loader, holding the lock if `token` is set. `fence: None` when Redis could not
    /// be asked: the result is then kept in process only. `stamp`: the key's invalidation stamp
    /// before the look that led (an invalidation since means the result may be older). `born`:
    /// the namespace clock Redis had as the load passed the gate (its result is born at it).
    /// `tags`: a refresh's entry's tags, kept by a result given none.
    Lead {
        token: Option<String>,
        fence: Option<Fence>,
        stamp: Option<Stamp>,
        born: Option<u64>,
        tags: Vec<String>,
    },
    /// Another process is refreshing the key: keep serving what we have.
    Skip,
    /// The cache closed while waiting.
    Closed,
}

/// What became of a load's bid for the lock, for observers (`stats` counts the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockOutcome {
    /// No bid (Redis had the value at once, was unavailable, or the cache closed).
    None,
    /// Took the lock at the first look (`lockWins`).
    Won,
    /// Another process held it; its value came (or Redis went away) while waiting (`lockWaits`).
    Waited,
    /// Waited, then took the lock: the holder failed or its lock expired (both counters).
    TookOver,
    /// Waited past two holders' lockTtl: loads without the lock (`lockWaits`).
    GaveUp,
    /// A background refresh: another process holds the lock and refreshes the key.
    Skipped,
}

impl Gate {
    /// Load without Redis: no lock, no fence (the result is kept in process only).
    pub(super) fn unfenced() -> Gate {
        Gate::Lead {
            token: None,
            fence: None,
            stamp: None,
            born: None,
            tags: Vec::new(),
        }
    }
}

/// One look of `cold_gate.lua`.
/// What a look asks of the key's value (`cold_gate.lua`'s ARGV[3]).
#[derive(Clone, Copy)]
enum LookMode {
    /// Return it if there is one.
    Value,
    /// Take the lock past it (the caller could not use it).
    PastValue,
    /// The caller just found none: put a marker in place at once.
    Missing,
}

enum Look {
    Value(Vec<u8>),
    Locked(Vec<u8>),
    Held(Vec<u8>, u64),
}

/// A bid that ends without the lock: `Waited` if it waited for another holder.
fn no_lock(waited: bool) -> LockOutcome {
    if waited {
        LockOutcome::Waited
    } else {
        LockOutcome::None
    }
}

/// A fence as a script returned it (bytes: a generation is binary).
fn fence_bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

fn number(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        _ => 0,
    }
}

impl RedisTier {
    /// A marker for `value_key` (see `envelope_fence` in `envelope.lua`): the header of an
    /// entry with a new generation and no value, born at the clock known here. It lives
    /// `GENERATION_TTL` at most, as long as a fence is trusted (`Fences::outlived`).
    pub(super) fn marker(&self, value_key: &str) -> Vec<u8> {
        Envelope::new(SystemClock.now_ms(), 0.0, 0.0, 0.0, false)
            .born_at(self.inbox.clock())
            .encode_marker(&new_generation(), value_key)
    }

    /// The namespace clock known here, read before a gate is sent, when it may stand for
    /// Redis's (`Lock::vouched`): a load that passes the gate is born at it, and the gate need
    /// not read Redis's. `None`: the gate reads it.
    pub(super) fn known_clock(&self) -> Option<u64> {
        let known = self.inbox.clock();
        self.lock
            .vouched(self.bus_up(), Instant::now())
            .then_some(known)
    }

    /// A read of Redis's clock about to be sent (see `Lock::vouch`).
    fn clock_read_now(&self) -> ClockRead {
        self.lock.clock_read(self.bus_up(), Instant::now())
    }

    /// The clock a load that passed a gate not reading it is born at: `known` (see
    /// `known_clock`), else Redis's now.
    pub(super) async fn born_unread(&self, key: &str, known: Option<u64>) -> Option<u64> {
        if known.is_some() {
            return known;
        }
        let read = self.clock_read_now();
        let born = self.clock_now(key).await;
        if born.is_some() {
            self.lock.vouch(read);
        }
        born
    }

    /// One look (`cold_gate.lua`): what the key holds, or the lock's bid, and the namespace
    /// clock Redis had then (`None`: not read: a Cluster's, where the meta hash is another slot,
    /// or `read_clock` false, when the one known here stands for it).
    async fn look(
        &self,
        key: &str,
        token: &str,
        mode: LookMode,
        read_clock: bool,
    ) -> Result<(Look, Option<Option<String>>), Unavailable> {
        let keys = (self.value_key(key), self.lock_key(key));
        let meta_key = (read_clock && !self.link.topology.is_cluster()).then(|| self.meta_key());
        let meta = meta_key.as_deref();
        let lock_ttl_ms = self.lock.ttl_ms();
        let mark = next_echo();
        let reply: Option<Vec<Value>> = self
            .run("lock", key, |mut c| async move {
                let mut call = self.scripts.cold_gate.key(&keys.0);
                call.key(&keys.1);
                if let Some(meta) = meta {
                    call.key(meta);
                }
                call.arg(token)
                    .arg(lock_ttl_ms)
                    .arg(match mode {
                        LookMode::Value => "0",
                        LookMode::PastValue => "1",
                        LookMode::Missing => "2",
                    })
                    .arg(self.marker(&keys.0))
                    .arg(GENERATION_TTL.as_millis() as u64)
                    .arg(&mark);
                invoke_marked(&call, &mark, &mut c).await
            })
            .await?;
        let Some(reply) = reply else {
            // Out of step: the reply may be another key's bid (read as ours, a lock we do not
            // hold). Load without Redis; a lock the script took expires in lockTtl.
            self.misdelivered("lock", key);
            return Err(Unavailable);
        };
        let generation = reply.get(1).and_then(fence_bytes).unwrap_or_default();
        let clock = meta.map(|_| match reply.get(4) {
            Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        });
        let look = match reply.get(2).map(number) {
            Some(0) => match reply.first() {
                Some(Value::BulkString(b)) => Look::Value(b.clone()),
                _ => Look::Held(generation, 0),
            },
            Some(1) => Look::Locked(generation),
            _ => Look::Held(
                generation,
                reply.get(3).map(number).unwrap_or(0).max(0) as u64,
            ),
        };
        Ok((look, clock))
    }

    /// The clock a load that passed the gate is born at: the one its look read (sent as `sent`
    /// says), else `known` (see `known_clock`), else Redis's now.
    async fn born(
        &self,
        key: &str,
        read: Option<Option<String>>,
        known: Option<u64>,
        sent: ClockRead,
    ) -> Option<u64> {
        let Some(clock) = read else {
            return self.born_unread(key, known).await;
        };
        let born = self.clock_read(key, clock).await;
        if born.is_some() {
            self.lock.vouch(sent);
        }
        born
    }

    /// A cold load's way through Redis: the value if another process has it; else take the
    /// lock and load; else wait, woken by the bus, for the holder's value. A lock that expires
    /// is taken over by the first waiter to look (one extra load, at worst), and the others
    /// wait for whichever of the two values comes first. No wait for one holder lasts longer
    /// than lockTtl, and no waiter waits for more than two (2 x lockTtl in all): then it loads
    /// without the lock (fenced like any load). Ends at once when the cache closes.
    /// `past_value`: the caller could not use the value Redis has (its serializer failed on
    /// it): the first look takes the lock past it.
    pub async fn cold_gate(&self, key: &str, past_value: bool) -> Gate {
        self.cold_gate_observed(key, past_value, false).await.0
    }

    /// `cold_gate`, with what became of the bid for the lock. `looked`: the caller's own GET
    /// (the read lane's) found nothing usable just now, so none is sent first.
    pub async fn cold_gate_observed(
        &self,
        key: &str,
        past_value: bool,
        looked: bool,
    ) -> (Gate, LockOutcome) {
        let token = new_token();
        let mut patience = self.lock.patience(Instant::now());
        let mut past_value = past_value;
        // The caller's GET found nothing usable just now: the first look puts a marker in place
        // at once (reading the key only if something is there).
        let mut missing = looked && !past_value;
        // Most cold reads find the value: a plain GET answers them (0.3 µs of Redis time, where
        // the gate script takes 6.6 µs; measured with INFO commandstats). The script, which
        // takes the lock and reads the fence, runs only when the GET found nothing usable (dead
        // entries included), or at once when the caller could not read the value Redis has.
        if !past_value && !looked {
            match self.fetch(key, self.inbox.stamp(key), false).await {
                Fetched::Found(r) => return (Gate::Found(r), LockOutcome::None),
                Fetched::Unavailable => return (Gate::unfenced(), LockOutcome::None),
                Fetched::Missing => {}
            }
        }
        loop {
            if self.closed() {
                return (Gate::Closed, LockOutcome::None);
            }
            // Registered before looking, so an announcement between the look and the wait
            // still wakes us.
            let waiter = self.lock.register(key);
            let notified = waiter.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();

            let stamp = self.inbox.stamp(key);
            // Past an unusable value for one look only: a holder may write a good one meanwhile.
            let mode = if std::mem::take(&mut past_value) {
                LookMode::PastValue
            } else if std::mem::take(&mut missing) {
                LookMode::Missing
            } else {
                LookMode::Value
            };
            // Read before the look, so nothing announced after the gate ran is in it.
            let known = self.known_clock();
            let sent = self.clock_read_now();
            let (look, clock) = match self.look(key, &token, mode, known.is_none()).await {
                Err(Unavailable) => return (Gate::unfenced(), no_lock(patience.waited())),
                Ok(read) => read,
            };
            let left = match look {
                Look::Value(bytes) => {
                    let found = match usable(&bytes, self.policies.serializer, &self.value_key(key))
                    {
                        Ok(found) => found,
                        Err(Misdelivered) => {
                            // The script's reply cannot be trusted, the lock bid included:
                            // load without Redis (a lock it took expires in lockTtl).
                            self.misdelivered("lock", key);
                            return (Gate::unfenced(), no_lock(patience.waited()));
                        }
                    };
                    if let Some(mut found) = found {
                        match self.alive(key, &mut found.envelope, &found.tags).await {
                            Ok(true) => {
                                let waited = patience.waited();
                                return (Gate::Found(found.remote(stamp)), no_lock(waited));
                            }
                            Ok(false) => {}
                            Err(Unavailable) => {
                                return (Gate::unfenced(), no_lock(patience.waited()))
                            }
                        }
                    }
                    // Not ours, another serializer's, expired by our clock, or dead (cleared or
                    // tag-deleted since it was born): a miss; take the lock past it.
                    past_value = true;
                    continue;
                }
                Look::Locked(generation) => {
                    self.stats.lock_wins.incr();
                    let lead = Gate::Lead {
                        token: Some(token),
                        fence: Some(self.fences.read(generation)),
                        stamp: Some(stamp),
                        born: self.born(key, clock, known, sent).await,
                        tags: Vec::new(),
                    };
                    let outcome = if patience.waited() {
                        LockOutcome::TookOver
                    } else {
                        LockOutcome::Won
                    };
                    return (lead, outcome);
                }
                Look::Held(generation, left_ms) => {
                    if patience.begins_waiting() {
                        self.stats.lock_waits.incr();
                    }
                    match patience.held(left_ms, Instant::now()) {
                        Some(left) => left,
                        None => {
                            let lead = Gate::Lead {
                                token: None,
                                fence: Some(self.fences.read(generation)),
                                stamp: Some(stamp),
                                born: self.born(key, clock, known, sent).await,
                                tags: Vec::new(),
                            };
                            return (lead, LockOutcome::GaveUp);
                        }
                    }
                }
            };
            if self.closed() {
                return (Gate::Closed, LockOutcome::None);
            }
            let wait = Patience::paced(left, self.bus_up());
            let _ = tokio::time::timeout(wait, notified).await;
        }
    }

    /// A background refresh's way through Redis: only the lock holder refreshes; it re-checks
    /// first, in case another process has just refreshed (the Redis copy is newer than ours,
    /// `local_fresh_until`) or recorded a failure (error backoff). An XFetch refresh starts
    /// while the entry is still fresh, so freshness alone does not mean someone refreshed.
    pub async fn refresh_gate(&self, key: &str, local_fresh_until: f64) -> Gate {
        let token = new_token();
        let lock_ttl_ms = self.lock.ttl_ms();
        let stamp = self.inbox.stamp(key);
        let known = self.known_clock();
        let keys = (self.value_key(key), self.lock_key(key));
        let mark = next_echo();
        let reply: Result<Option<Vec<Value>>, Unavailable> = self
            .run("lock", key, |mut c| {
                let token = token.clone();
                let mark = &mark;
                async move {
                    let mut call = self.scripts.refresh_gate.key(&keys.0);
                    call.key(&keys.1)
                        .arg(token)
                        .arg(lock_ttl_ms)
                        .arg(self.marker(&keys.0))
                        .arg(GENERATION_TTL.as_millis() as u64)
                        .arg(mark);
                    invoke_marked(&call, mark, &mut c).await
                }
            })
            .await;
        let reply = match reply {
            Err(Unavailable) => return Gate::unfenced(),
            Ok(None) => {
                // Out of step: whether we hold the lock is unknown; free it if we do.
                self.misdelivered("lock", key);
                self.release(key, &token, false).await;
                return Gate::unfenced();
            }
            Ok(Some(r)) => r,
        };
        if reply.first().map(number) != Some(1) {
            return Gate::Skip;
        }
        self.stats.lock_wins.incr();
        let generation = reply.get(2).and_then(fence_bytes).unwrap_or_default();
        let now = SystemClock.now_ms();
        let mut tags = Vec::new();
        if let Some(Value::BulkString(b)) = reply.get(1) {
            let found = match usable(b, self.policies.serializer, &self.value_key(key)) {
                Ok(found) => found,
                Err(Misdelivered) => {
                    self.misdelivered("lock", key);
                    self.release(key, &token, false).await;
                    return Gate::unfenced();
                }
            };
            if let Some(mut found) = found {
                let e = found.envelope;
                if e.fresh_until > local_fresh_until || !e.refresh_allowed(now) {
                    // Redis has a newer copy, or a failed refresh holds refreshes back: use it,
                    // unless it is dead or tag-expired since it was born (then refresh it: an
                    // expireByTag leaves the copy in Redis as it was).
                    match self.alive(key, &mut found.envelope, &found.tags).await {
                        Ok(true)
                            if found.envelope.fresh_until >= e.fresh_until
                                || !e.refresh_allowed(now) =>
                        {
                            self.release(key, &token, false).await;
                            return Gate::Found(found.remote(stamp));
                        }
                        Ok(_) => {}
                        Err(Unavailable) => {
                            self.release(key, &token, false).await;
                            return Gate::unfenced();
                        }
                    }
                }
                tags = found.tags;
            }
        }
        Gate::Lead {
            token: Some(token),
            fence: Some(self.fences.read(generation)),
            stamp: Some(stamp),
            born: self.born_unread(key, known).await,
            tags,
        }
    }

    /// A forceRefresh's fence: the key's state now (no lock: a forced load is written whoever
    /// holds it).
    pub async fn force_gate(&self, key: &str) -> Gate {
        let stamp = self.inbox.stamp(key);
        let known = self.known_clock();
        let vkey = self.value_key(key);
        let marker = self.marker(&vkey);
        let mark = next_echo();
        let state = self.run("get", key, |mut c| async move {
            let mut call = self.scripts.fence.key(&vkey);
            call.arg(&marker)
                .arg(GENERATION_TTL.as_millis() as u64)
                .arg(&mark);
            let reply = invoke_marked(&call, &mark, &mut c).await?;
            Ok(reply.map(|r| r.first().and_then(fence_bytes).unwrap_or_default()))
        });
        let (state, born) = tokio::join!(state, self.born_unread(key, known));
        match state {
            Ok(None) => {
                // Out of step: the fence may be another key's; load unfenced.
                self.misdelivered("get", key);
                Gate::unfenced()
            }
            Ok(Some(state)) => Gate::Lead {
                token: None,
                fence: Some(self.fences.read(state)),
                stamp: Some(stamp),
                born,
                tags: Vec::new(),
            },
            Err(Unavailable) => Gate::unfenced(),
        }
    }

    /// Releases `token`'s lock; `announce` wakes the processes waiting on it (a failed cold
    /// load, a timed-out one).
    pub async fn release(&self, key: &str, token: &str, announce: bool) {
        let (lkey, msg) = (self.lock_key(key), self.bus.announcement(key));
        if announce {
            self.bus.carried().expect_own(key);
        }
        let mark = next_echo();
        let released = self
            .run("unlock", key, |mut c| async move {
                let channel = if announce { self.bus.channel() } else { "" };
                let mut call = self.scripts.release.key(&lkey);
                call.key(self.value_key(key))
                    .arg(token)
                    .arg(channel)
                    .arg(&msg)
                    .arg(&mark);
                let reply = invoke_marked(&call, &mark, &mut c).await?;
                Ok(reply.map(|r| r.first().map_or(0, int)))
            })
            .await;
        if released == Ok(None) {
            // Out of step: the lock, if still ours, expires in lockTtl.
            self.misdelivered("unlock", key);
        }
        if announce && released == Ok(Some(0)) {
            // Not ours any more: nothing was announced.
            self.bus.carried().own_heard(key);
        }
    }

    /// `lkey`'s remaining life in ms (None: absent; Some(u64::MAX): no expiry). For tests.
    pub async fn lock_left_ms(&self, key: &str) -> Result<Option<u64>, Unavailable> {
        let lkey = self.lock_key(key);
        let pttl: i64 = self
            .run("get", key, |mut c| async move {
                redis::cmd("PTTL").arg(&lkey).query_async(&mut c).await
            })
            .await?;
        Ok(match pttl {
            -2 => None,
            -1 => Some(u64::MAX),
            n => Some(n.max(0) as u64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::new_token;

    #[test]
    fn tokens_are_distinct_version_4_uuids() {
        let tokens: std::collections::HashSet<String> = (0..10_000).map(|_| new_token()).collect();
        assert_eq!(tokens.len(), 10_000);
        for t in tokens.iter().take(100) {
            let u = uuid::Uuid::parse_str(t).expect("a UUID");
            assert_eq!(u.get_version_num(), 4);
            assert_eq!(u.get_variant(), uuid::Variant::RFC4122);
            assert_eq!(t, &u.simple().to_string());
        }
    }
}
