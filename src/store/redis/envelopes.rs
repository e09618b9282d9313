//! Envelopes in Redis: reads, and writes fenced against newer state. A key's fence is the
//! generation inside its envelope (new with every write, and with an `expire`), or its lock
//! when it holds none. A load's result is written only if the fence is still the one the load
//! began from (`write_back.lua`), so neither a `set`, `delete` or `expire` since, nor the result
//! of a load that took over an expired lock, is ever overwritten. A `clear` or `deleteByTag` since
//! the load began makes its result dead on arrival instead (see `tags.rs`).

use redis::Value;

use super::fence::Fence;
use super::replaying::{Applied, Replaying};
use super::{RedisTier, Remote, Unavailable};
use crate::clock::{Clock, SystemClock};
use crate::envelope::{load_generation, new_generation, Body, Envelope, Fmt, Serializer, State};
use crate::inbox::{tag_bucket, Stamp};

/// A random token naming one lock holder, or one generation of a key: a version 4 UUID whose
/// bytes come from the thread's CSPRNG (seeded by the OS, reseeded as it goes), not from a
/// `getrandom` system call per token as `Uuid::new_v4` makes. Every read on the runtime path
/// makes one, and the kernel's `getrandom` was visible in its profile.
pub fn new_token() -> String {
    uuid::Builder::from_random_bytes(rand::random())
        .into_uuid()
        .simple()
        .to_string()
}

/// A fresh mark for an echo (see [`Echo`]). Never a bare number: a tag key or the namespace
/// clock holds one, and a moved clock landing in the echo's place must not match.
pub(super) fn next_echo() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("e{n}")
}

/// What proves a pipeline's replies are the ones in their place: a fresh mark, asked back after
/// the pipeline's commands on the same connection. An extra reply in front of theirs (or one
/// missing) moves the last command's reply into the mark's place, and the call is refused, so a
/// lock bid, a fence, a clock or a value is never read from another command's reply.
///
/// On a single server (or a Sentinel's primary) the mark is asked back by `ECHO`. A Cluster
/// routes a keyless ECHO to another node than the keyed command, so there it is asked back by
/// `echo.lua` declaring the command's key (`routed_by`): the pipeline goes to that key's slot,
/// the command and its echo on one connection.
pub(super) struct Echo {
    mark: String,
    routed_by: Option<Vec<u8>>,
}

impl Echo {
    /// An echo by `ECHO`, for a connection that is not a Cluster's.
    pub(super) fn plain() -> Self {
        Echo {
            mark: next_echo(),
            routed_by: None,
        }
    }

    /// An echo by `echo.lua` declaring `redis_key`, the key of the command it guards.
    pub(super) fn keyed(redis_key: impl Into<Vec<u8>>) -> Self {
        Echo {
            mark: next_echo(),
            routed_by: Some(redis_key.into()),
        }
    }

    /// Appends the echo to `pipe`, after the commands it guards.
    pub(super) fn push(&self, pipe: &mut redis::Pipeline) {
        match &self.routed_by {
            None => pipe.cmd("ECHO").arg(&self.mark),
            Some(key) => pipe
                .cmd("EVAL")
                .arg(super::scripts::ECHO.as_str())
                .arg(1)
                .arg(key.as_slice())
                .arg(&self.mark),
        };
    }

    /// Whether `reply`, in the echo's place, is its mark.
    pub(super) fn answered_by(&self, reply: Option<&Value>) -> bool {
        matches!(reply, Some(Value::BulkString(b)) if b == self.mark.as_bytes())
    }

    /// Sends `pipe` (its commands, `ignore_errors` set) with the echo after them, in one round
    /// trip on `c`: the commands' replies, or `Ok(None)` when the echo's place holds anything
    /// else (out of step). The one place every echoed call is checked.
    pub(super) async fn send(
        &self,
        mut pipe: redis::Pipeline,
        c: &mut super::topology::Connection,
    ) -> redis::RedisResult<Option<Vec<Value>>> {
        self.push(&mut pipe);
        let replies: Vec<Value> = match &self.routed_by {
            // Routed by the echo's key, so the echo goes where that key's commands go, and
            // the pipeline may hold any other key of that node (a batch's).
            Some(key) => c.pipeline_by(pipe, key).await?,
            None => pipe.query_async(c).await?,
        };
        Ok(self.checked(replies))
    }

    /// The replies of a pipeline this echo was pushed to last, without the echo's: `None` when
    /// its place holds anything else (out of step). For pipelines sent another way than `send`
    /// (to one node of a cluster, say).
    pub(super) fn checked(&self, mut replies: Vec<Value>) -> Option<Vec<Value>> {
        if !self.answered_by(replies.last()) {
            return None;
        }
        replies.pop();
        Some(replies)
    }
}

/// Runs `cmd` with `echo` pipelined after it, as `invoke_echoed` does for a script: `Ok(None)`
/// when the echo's place holds anything else (the command's reply was moved), so a clock is
/// never read from another command's reply. An error reply is the command's error.
pub(super) async fn query_echoed<T: redis::FromRedisValue>(
    cmd: &redis::Cmd,
    c: &mut super::topology::Connection,
    echo: Echo,
) -> redis::RedisResult<Option<T>> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors().add_command(cmd.clone());
    let Some(replies) = echo.send(pipe, c).await? else {
        return Ok(None);
    };
    match replies.into_iter().next() {
        Some(Value::ServerError(e)) => Err(e.into()),
        Some(v) => Ok(Some(redis::from_redis_value(v)?)),
        None => Ok(None),
    }
}

/// Runs a script with `echo` pipelined after it, in one round trip: an extra reply in front of
/// the script's, or a missing one, moves the script's reply into the echo's place, and the call
/// is refused (`Ok(None)`), so a lock bid, a fence or a write's outcome is never read from
/// another command's reply (another key's bid read as won, a dropped write read as written). A
/// NOSCRIPT reply loads the script and calls it again, as `invoke_async` does.
pub(super) async fn invoke_echoed<T: redis::FromRedisValue>(
    invocation: &redis::ScriptInvocation<'_>,
    c: &mut super::topology::Connection,
    echo: Echo,
) -> redis::RedisResult<Option<T>> {
    let mut loaded = false;
    loop {
        let mut pipe = redis::pipe();
        pipe.ignore_errors().invoke_script(invocation);
        let Some(replies) = echo.send(pipe, c).await? else {
            return Ok(None);
        };
        match replies.into_iter().next() {
            Some(Value::ServerError(e)) if e.code() == "NOSCRIPT" && !loaded => {
                invocation.load_async(c).await?;
                loaded = true;
            }
            Some(Value::ServerError(e)) => return Err(e.into()),
            Some(v) => return Ok(Some(redis::from_redis_value(v)?)),
            None => return Ok(None),
        }
    }
}

/// Runs a script that returns an array ending with the mark it was given (its last ARGV, from
/// [`next_echo`]), with no echo beside it: the reply proves its own place. An extra reply in
/// front of the script's, or a missing one, puts a reply without this mark in its place, and the
/// call is refused (`Ok(None)`). Returns the array without the mark. (A NOSCRIPT reply loads the
/// script and calls it again, with the same mark, as `invoke_async` does: whatever the retry
/// reads in its place is refused unless it ends with the mark.)
pub(super) async fn invoke_marked(
    invocation: &redis::ScriptInvocation<'_>,
    mark: &str,
    c: &mut super::topology::Connection,
) -> redis::RedisResult<Option<Vec<Value>>> {
    let reply: Value = invocation.invoke_async(c).await?;
    Ok(marked(reply, mark))
}

/// An integer reply (0 for anything else).
pub(super) fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        _ => 0,
    }
}

/// The items of `reply` before its last, if it is an array whose last item is `mark`.
pub(super) fn marked(reply: Value, mark: &str) -> Option<Vec<Value>> {
    let Value::Array(mut items) = reply else {
        return None;
    };
    match items.last() {
        Some(Value::BulkString(b)) if b == mark.as_bytes() => {
            items.pop();
            Some(items)
        }
        _ => None,
    }
}

impl RedisTier {
    /// Records a write of `key` by this process (see `lane::Written`): before it is sent, and
    /// again once Redis answered it, before its caller is told.
    pub(super) fn wrote_here(&self, key: &str) {
        self.written.record(key);
    }

    /// The echo for the next call whose command routes by `redis_key` (see [`Echo`]).
    pub(super) fn echo(&self, redis_key: impl AsRef<[u8]>) -> Echo {
        if self.link.topology.is_cluster() {
            Echo::keyed(redis_key.as_ref())
        } else {
            Echo::plain()
        }
    }
}

/// A read of one key.
#[derive(Debug, Clone, PartialEq)]
pub enum Fetched {
    Found(Remote),
    Missing,
    Unavailable,
}

/// What became of a load's write-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteBack {
    /// In Redis now.
    Written,
    /// Something newer happened to the key since the load began: written nowhere.
    Dropped,
    /// Redis could not be asked now (down, an error): kept in process only.
    Unavailable,
    /// Not sent: the load began without a fence (Redis was unavailable then), or too long ago.
    NotSent,
}

/// An envelope read from Redis that this cache can use (before its tags are checked).
#[derive(Debug, Clone, PartialEq)]
pub struct Usable {
    pub envelope: Envelope,
    pub value_json: Option<String>,
    pub tags: Vec<String>,
    pub fmt: Fmt,
}

/// A reply read as `value_key`'s envelope names another key: it was delivered for another
/// request (the connection lost its alignment, or something between us and Redis is broken).
/// Never served; the connection that delivered it is replaced (`RedisTier::misdelivered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Misdelivered;

/// An envelope this library wrote for `value_key` with `serializer`'s format and that is not
/// expired. Anything else (other data, another Redis type, a marker, another serializer's
/// value, expired by our clock) is `Ok(None)`: a miss, never an error. One that
/// names another key is `Err(Misdelivered)`.
pub fn usable(
    bytes: &[u8],
    serializer: Serializer,
    value_key: &str,
) -> Result<Option<Usable>, Misdelivered> {
    usable_marked(bytes, serializer, crate::envelope::key_mark_bits(value_key))
}

/// [`usable`] for the value key whose mark is `mark` (`key::value_key_mark`: a read lane's
/// check, with no String of the key made per value).
pub fn usable_marked(
    bytes: &[u8],
    serializer: Serializer,
    mark: u64,
) -> Result<Option<Usable>, Misdelivered> {
    let Some(d) = Envelope::decode(bytes) else {
        return Ok(None);
    };
    if !d.written_for_mark(mark) {
        return Err(Misdelivered);
    }
    if d.marker
        || d.envelope.state(SystemClock.now_ms()) == State::Expired
        || !serializer.reads(d.fmt)
    {
        return Ok(None);
    }
    Ok(Some(Usable {
        envelope: d.envelope,
        value_json: d.value_json.map(std::borrow::Cow::into_owned),
        tags: d.tags,
        fmt: d.fmt,
    }))
}

impl Usable {
    pub fn remote(self, stamp: crate::inbox::Stamp) -> Remote {
        Remote {
            envelope: self.envelope,
            value_json: self.value_json,
            stamp,
            tags: self.tags,
            fmt: self.fmt,
        }
    }
}

impl RedisTier {
    /// The envelope another process's announcement carried for `key`, if nothing was heard of
    /// the key since (`stamp`, taken on the caller's thread, is still the announcement's): a
    /// read that needs no Redis round trip. Taken once; then the key is in process.
    pub fn take_carried(&self, key: &str, stamp: Stamp) -> Option<Remote> {
        let bytes = self.bus.carried().take(key, stamp)?;
        // One naming another key is no more served than a reply would be.
        let found = usable(&bytes, self.policies.serializer, &self.value_key(key)).ok()??;
        // Tagged envelopes are never carried (their tags' clocks are checked in Redis).
        if !found.tags.is_empty() {
            return None;
        }
        Some(found.remote(stamp))
    }

    /// Reads the key's envelope. `stamp`: the key's invalidation stamp when the read was asked
    /// for, taken by the caller on its own thread before any later write of this process could
    /// change it (taken here, on a runtime thread, it could already include such a write, and
    /// the older value read would be kept over it). `count`: a read for `get()`, counted as an
    /// l2Hit or a miss.
    pub async fn fetch(&self, key: &str, stamp: Stamp, count: bool) -> Fetched {
        let fetched = self.fetch_uncounted(key, stamp).await;
        if count {
            match fetched {
                Fetched::Found(_) => self.stats.l2_hits.incr(),
                _ => self.stats.misses.incr(),
            }
        }
        fetched
    }

    async fn fetch_uncounted(&self, key: &str, stamp: Stamp) -> Fetched {
        let vkey = self.value_key(key);
        // The GET travels with an echo (see `Echo`): an extra reply in front of ours (an old
        // reply of this very key, which its key mark cannot tell) moves ours into the echo's
        // place, and the read is refused.
        let echo = self.echo(&vkey);
        let raw = self
            .run("get", key, |mut c| async move {
                let mut pipe = redis::pipe();
                pipe.ignore_errors().cmd("GET").arg(&vkey);
                let got: redis::RedisResult<(Option<Vec<u8>>, bool)> =
                    match echo.send(pipe, &mut c).await? {
                        None => Ok((None, false)),
                        Some(replies) => match replies.into_iter().next() {
                            Some(Value::BulkString(b)) => Ok((Some(b), true)),
                            Some(Value::Nil) => Ok((None, true)),
                            Some(Value::ServerError(e)) => Err(e.into()),
                            // A reply no GET gives: out of step.
                            _ => Ok((None, false)),
                        },
                    };
                match got {
                    Err(e) if e.code() == Some("WRONGTYPE") => Ok((None, true)),
                    other => other,
                }
            })
            .await;
        let raw = match raw {
            Ok((_, false)) => {
                self.misdelivered("get", key);
                return Fetched::Missing;
            }
            Ok((v, true)) => Ok(v),
            Err(e) => Err(e),
        };
        let found = match raw {
            Err(Unavailable) => return Fetched::Unavailable,
            Ok(None) => return Fetched::Missing,
            Ok(Some(bytes)) => match usable(&bytes, self.policies.serializer, &self.value_key(key))
            {
                Ok(Some(found)) => found,
                Ok(None) => return Fetched::Missing,
                Err(Misdelivered) => {
                    self.misdelivered("get", key);
                    return Fetched::Missing;
                }
            },
        };
        let mut found = found;
        match self.alive(key, &mut found.envelope, &found.tags).await {
            Ok(true) => Fetched::Found(found.remote(stamp)),
            Ok(false) => Fetched::Missing,
            Err(Unavailable) => Fetched::Unavailable,
        }
    }

    /// Writes a load's result if nothing newer happened to the key since `fence` was read,
    /// releases `token`'s lock either way, and announces the key. A `forced` load began after
    /// any load still running: only a `set` or `delete` since drops it. Run it through
    /// `in_order`.
    pub async fn write_back(
        &self,
        key: &str,
        written: Option<(&Envelope, &Body<'_>)>,
        token: Option<&str>,
        fence: Option<&Fence>,
        forced: bool,
    ) -> WriteBack {
        let too_old = fence.is_some_and(|f| self.fences.outlived(f));
        let (Some((envelope, body)), Some(fence), false, false) =
            (written, fence, too_old, self.closed())
        else {
            // Nothing to write (superseded, closed, unfenced): free the lock for the next load.
            if let Some(token) = token {
                self.release(key, token, true).await;
            }
            return WriteBack::NotSent;
        };
        let buckets: Vec<u16> = body.tags.iter().map(|t| tag_bucket(t)).collect();
        if self.inbox.dead(envelope.born, &buckets) {
            // A clear or deleteByTag since the load began, heard here already: its result
            // would be dead on arrival.
            if let Some(token) = token {
                self.release(key, token, true).await;
            }
            return WriteBack::Dropped;
        }
        let px = envelope.remaining_ms(SystemClock.now_ms());
        self.wrote_here(key);
        let keys = (self.value_key(key), self.lock_key(key));
        let text = envelope.encode(body, &load_generation(&fence.state), &keys.0);
        let msg = self.bus.announcement(key);
        // Published instead of `msg` when the script writes, with the envelope written after
        // it: other processes then have the value without reading it (see `carried.rs`).
        let carrying = self
            .bus
            .carrying_announcement(key, text.len(), !body.tags.is_empty());
        self.bus.carried().expect_own(key);
        let mark = next_echo();
        let written = self
            .run("set", key, |mut c| async move {
                let mut call = self.scripts.write_back.key(&keys.0);
                call.key(&keys.1)
                    .key(self.generation_key(key))
                    .arg(&text)
                    .arg(px)
                    .arg(token.unwrap_or(""))
                    .arg(&fence.state)
                    .arg(if forced { "1" } else { "0" })
                    .arg(self.bus.channel())
                    .arg(&msg)
                    .arg(&carrying)
                    .arg(&mark);
                let reply = invoke_marked(&call, &mark, &mut c).await?;
                Ok(reply.map(|r| (r.first().map_or(0, int), r.get(1).map_or(0, int))))
            })
            .await;
        self.wrote_here(key);
        if let Ok(Some((_, 0))) = written {
            // Nothing announced (a result written over a marker no one waited on, or dropped
            // without a lock to release): no own announcement to wait for.
            self.bus.carried().own_heard(key);
        }
        match written.map(|r| r.map(|(w, _)| w)) {
            Ok(Some(1)) => WriteBack::Written,
            Ok(None) => {
                // Out of step: whether the script wrote is unknown, so the result is kept
                // nowhere (as if dropped); the lock, if still ours, is freed on the next
                // connection.
                self.misdelivered("set", key);
                match token {
                    Some(token) => self.release(key, token, true).await,
                    None => self.bus.carried().own_heard(key),
                }
                WriteBack::Dropped
            }
            Ok(Some(_)) => WriteBack::Dropped,
            Err(Unavailable) => {
                // The script may not have run: free the lock if it is still ours.
                if let Some(token) = token {
                    self.release(key, token, true).await;
                }
                WriteBack::Unavailable
            }
        }
    }

    /// `set` (`Some`) or `delete` (`None`), made at `at_ms` (epoch ms): the newest state of the
    /// key, with a new generation that drops every load that began before (a set's envelope
    /// names `at_ms`; a delete leaves nothing). `Applied::Wrote`: whether the key held a
    /// value. `replayed`: the change was made at that time and Redis could not take it then;
    /// `Superseded` when the key holds a change made at or after it (not applied), and, for a
    /// set, `Invalidated` when the key holds other than it expected (deleted instead).
    /// A set's entry is born at the namespace clock known when it runs (after every earlier
    /// deleteByTag and clear of this instance); Redis's clock is read alongside, and if it was
    /// ahead (one elsewhere, not yet heard of here) the entry's born is raised to it, so a set
    /// made after a deleteByTag elsewhere is never taken for older than it. Run it through
    /// `in_order`.
    pub async fn write(
        &self,
        key: &str,
        written: Option<(&Envelope, &Body<'_>)>,
        at_ms: u64,
        replayed: Option<Replaying>,
    ) -> Result<Applied, Unavailable> {
        self.wrote_here(key);
        let generation = new_generation();
        let (text, px, born) = match written {
            Some((envelope, body)) => {
                let born = envelope.born.max(self.inbox.clock());
                (
                    envelope.born_at(born).encode_made_at(
                        body,
                        &generation,
                        &self.value_key(key),
                        at_ms,
                    ),
                    envelope.remaining_ms(SystemClock.now_ms()),
                    Some(born),
                )
            }
            None => (Vec::new(), 1, None),
        };
        let keys = (self.value_key(key), self.generation_key(key));
        let msg = self.bus.announcement(key);
        let op = if written.is_some() { "set" } else { "delete" };
        let vkey = keys.0.clone();
        self.bus.carried().expect_own(key);
        let mark = next_echo();
        let wrote = self.run(op, key, |mut c| async move {
            let mut call = self.scripts.write.key(&keys.0);
            call.key(&keys.1)
                .arg(&text)
                .arg(px)
                .arg(self.bus.channel())
                .arg(&msg)
                .arg(&mark)
                .arg(replayed.map_or(String::new(), |r| r.made_at.to_string()))
                .arg(replayed.map_or(Vec::new(), |r| r.expected.arg(self.inbox.cleared())));
            let reply = invoke_marked(&call, &mark, &mut c).await?;
            Ok(reply.map(|r| r.first().map_or(0, int)))
        });
        let clock = async {
            match born {
                Some(_) => self.clock_now(key).await,
                None => None,
            }
        };
        let (existed, clock) = tokio::join!(wrote, clock);
        // Whatever Redis answered, the key may have changed there now: a read this instance sent
        // after the write was asked for, answered before it ran, must not be kept (its stamp
        // predates this; see also `WriteOrder::busy`).
        self.inbox.touch(key);
        self.wrote_here(key);
        let Some(existed) = existed? else {
            // Out of step: whether it was written is unknown, as after a timeout.
            self.misdelivered(op, key);
            return Err(Unavailable);
        };
        if existed == -1 {
            // A replay older than what the key holds: nothing was written (nor announced).
            self.bus.carried().own_heard(key);
            return Ok(Applied::Superseded);
        }
        if existed < 0 {
            // A replayed set over a key that changed unseen: deleted instead, and announced.
            return Ok(Applied::Invalidated);
        }
        if let (Some(born), Some(clock)) = (born, clock) {
            if clock > born {
                let echo = self.echo(&vkey);
                let reborn = self
                    .run(op, key, |mut c| async move {
                        let mut call = self.scripts.reborn.key(&vkey);
                        call.arg(&generation[..]).arg(clock);
                        invoke_echoed::<i64>(&call, &mut c, echo).await
                    })
                    .await;
                if reborn == Ok(None) {
                    self.misdelivered(op, key);
                }
            }
        }
        Ok(Applied::Wrote {
            existed: existed == 1,
        })
    }

    /// `expire(key)` in Redis, already applied here: the entry keeps its value and expiry but its
    /// freshUntil becomes `now` and its generation is drawn anew, set part included
    /// (`expire.lua`): a load that began before, forced or not, never writes back, as after a
    /// delete. Other processes drop their copies. Returns whether the key held a value. Run it
    /// through `in_order`.
    pub async fn expire(&self, key: &str, now: f64) -> Result<bool, Unavailable> {
        self.wrote_here(key);
        let keys = (self.value_key(key), self.generation_key(key));
        let msg = self.bus.announcement(key);
        self.bus.carried().expect_own(key);
        let generation = new_generation();
        let mark = next_echo();
        let expired = self
            .run("expire", key, |mut c| async move {
                let mut call = self.scripts.expire.key(&keys.0);
                call.key(&keys.1)
                    .arg(now as u64)
                    .arg(&generation[..])
                    .arg(self.bus.channel())
                    .arg(&msg)
                    .arg(&mark);
                let reply = invoke_marked(&call, &mark, &mut c).await?;
                Ok(reply.map(|r| r.first().map_or(0, int)))
            })
            .await;
        // A read sent before this, answered after, must not be kept over it.
        self.inbox.touch(key);
        self.wrote_here(key);
        let Some(existed) = expired? else {
            self.misdelivered("expire", key);
            return Err(Unavailable);
        };
        Ok(existed == 1)
    }

    /// A load holding `token` failed or timed out: record a failed refresh's `retry_after` in
    /// the Redis envelope (so no process refreshes the key again before then), and release the
    /// lock, announcing it so waiters take over at once. Run it through `in_order`.
    pub async fn record_failure(&self, key: &str, token: Option<&str>, retry_after: f64) {
        if retry_after > 0.0 {
            self.record_retry_after(key, retry_after).await;
        }
        if let Some(token) = token {
            self.release(key, token, true).await;
        }
    }

    async fn record_retry_after(&self, key: &str, retry_after: f64) {
        let vkey = self.value_key(key);
        let current = self
            .run("get", key, |mut c| {
                let vkey = vkey.clone();
                async move {
                    match redis::cmd("GET")
                        .arg(&vkey)
                        .query_async::<Option<Vec<u8>>>(&mut c)
                        .await
                    {
                        Err(e) if e.code() == Some("WRONGTYPE") => Ok(None),
                        other => other,
                    }
                }
            })
            .await;
        let Ok(Some(text)) = current else { return };
        let Some(d) = Envelope::decode(&text) else {
            return;
        };
        if d.marker || !d.written_for(&vkey) {
            return;
        }
        let mut envelope = d.envelope;
        envelope.retry_after = envelope.retry_after.max(retry_after);
        // The same generation (an old JSON envelope's cannot be kept: it gets a new one), so a
        // load fenced by this entry is not dropped for a recorded backoff.
        let generation: crate::envelope::Generation =
            d.generation.try_into().unwrap_or_else(|_| new_generation());
        // The time of the key's last set or delete stays too (see `write.lua`).
        let replacement = envelope.encode_made_at(&d.body(), &generation, &vkey, d.made_at);
        let echo = self.echo(&vkey);
        let replaced = self
            .run("set", key, |mut c| async move {
                let mut call = self.scripts.replace.key(&vkey);
                call.arg(&text).arg(&replacement);
                invoke_echoed::<i64>(&call, &mut c, echo).await
            })
            .await;
        if replaced == Ok(None) {
            self.misdelivered("set", key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::guard::Scanner;
    use crate::store::redis::topology::Connection;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The commands a client sent, each as its list of arguments.
    fn commands(input: &[u8]) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        let (mut scan, mut start) = (Scanner::default(), 0);
        for i in 0..input.len() {
            let before = scan.replies;
            scan.feed(&input[i..=i]).expect("the client sends RESP");
            if scan.replies > before {
                let Ok(Value::Array(args)) = redis::parse_redis_value(&input[start..=i]) else {
                    panic!("a command is an array")
                };
                out.push(
                    args.iter()
                        .map(|a| match a {
                            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                            other => format!("{other:?}"),
                        })
                        .collect(),
                );
                start = i + 1;
            }
        }
        out
    }

    /// A server that answers each command with `answer(command)` (the crate's handshake: OK).
    async fn serve(
        mut server: tokio::io::DuplexStream,
        answer: impl Fn(&[String]) -> Vec<u8> + Send + 'static,
    ) {
        let mut input = Vec::new();
        let mut answered = 0;
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = server.read(&mut buf).await {
            if n == 0 {
                return;
            }
            input.extend_from_slice(&buf[..n]);
            let all = commands(&input);
            for command in &all[answered..] {
                let reply = if command[0] == "CLIENT" {
                    b"+OK\r\n".to_vec()
                } else {
                    answer(command)
                };
                if server.write_all(&reply).await.is_err() {
                    return;
                }
            }
            answered = all.len();
        }
    }

    async fn connection(answer: impl Fn(&[String]) -> Vec<u8> + Send + 'static) -> Connection {
        let (client, server) = tokio::io::duplex(64 * 1024);
        tokio::spawn(serve(server, answer));
        let (conn, driver) = redis::aio::MultiplexedConnection::new_with_config(
            &redis::RedisConnectionInfo::default(),
            client,
            redis::AsyncConnectionConfig::new(),
        )
        .await
        .unwrap();
        tokio::spawn(driver);
        Connection::Single(conn)
    }

    /// A script's replies moved by an extra one in front: another key's won bid, then ours, held
    /// by someone else.
    const MOVED_BIDS: &[u8] =
        b"*3\r\n$-1\r\n$5\r\nother\r\n:1\r\n*4\r\n$-1\r\n$4\r\nours\r\n:2\r\n:90\r\n";

    /// A server that does not know `script` until `SCRIPT LOAD` (its first `EVALSHA` meets
    /// NOSCRIPT), then answers as `then` does; and whether it was loaded.
    fn loading_first(
        script: &redis::Script,
        then: impl Fn(&[String]) -> Vec<u8> + Send + 'static,
    ) -> (
        std::sync::Arc<std::sync::atomic::AtomicBool>,
        impl Fn(&[String]) -> Vec<u8> + Send + 'static,
    ) {
        use std::sync::atomic::Ordering::SeqCst;
        let loaded = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = loaded.clone();
        let hash = script.get_hash().to_string();
        let answer = move |command: &[String]| match command[0].as_str() {
            "EVALSHA" if !seen.load(SeqCst) => b"-NOSCRIPT No matching script\r\n".to_vec(),
            "SCRIPT" => {
                seen.store(true, SeqCst);
                format!("${}\r\n{hash}\r\n", hash.len()).into_bytes()
            }
            _ => then(command),
        };
        (loaded, answer)
    }

    fn echo_of(command: &[String]) -> Vec<u8> {
        format!("${}\r\n{}\r\n", command[1].len(), command[1]).into_bytes()
    }

    /// Another key's won bid in front of ours: the reply read in our place is proven out of
    /// step by the echo, never taken for our bid.
    #[tokio::test(flavor = "current_thread")]
    async fn a_script_reply_moved_by_an_extra_one_is_refused() {
        let mut c = connection(|command| match command[0].as_str() {
            "EVALSHA" => MOVED_BIDS.to_vec(),
            "ECHO" => echo_of(command),
            _ => b"-ERR unexpected\r\n".to_vec(),
        })
        .await;
        let script = redis::Script::new("return 1");
        let call = script.key("k");
        let got: Option<Vec<Value>> = invoke_echoed(&call, &mut c, Echo::plain()).await.unwrap();
        assert_eq!(got, None);
        // Without the echo, the moved reply is read as ours: the other key's won bid.
        let mut c = connection(|command| match command[0].as_str() {
            "EVALSHA" => MOVED_BIDS.to_vec(),
            _ => b"-ERR unexpected\r\n".to_vec(),
        })
        .await;
        let got: Vec<Value> = call.invoke_async(&mut c).await.unwrap();
        assert_eq!(got.get(2), Some(&Value::Int(1)));
    }

    /// A number in front of a clock's read: the clock read in our place is proven out of step
    /// by the echo, even when the clock moved into the echo's place is a number like the marks.
    #[tokio::test(flavor = "current_thread")]
    async fn a_clock_read_moved_by_an_extra_number_is_refused() {
        let answer = |command: &[String]| match command[0].as_str() {
            "HGET" => b":9\r\n$2\r\n42\r\n".to_vec(),
            "ECHO" => echo_of(command),
            _ => b"-ERR unexpected\r\n".to_vec(),
        };
        let mut read = redis::cmd("HGET");
        read.arg("ns:meta").arg("clock");
        let mark = next_echo();
        assert!(mark.parse::<u64>().is_err(), "{mark}");
        let mut c = connection(answer).await;
        let echo = Echo {
            mark,
            routed_by: None,
        };
        let got: Option<Option<String>> = query_echoed(&read, &mut c, echo).await.unwrap();
        assert_eq!(got, None);
        // Without the echo, the extra number is read as the clock.
        let mut c = connection(answer).await;
        let got: Option<String> = read.query_async(&mut c).await.unwrap();
        assert_eq!(got, Some("9".to_string()));
    }

    /// In step: the command's reply, or its error.
    #[tokio::test(flavor = "current_thread")]
    async fn an_aligned_clock_read_is_read_and_an_error_is_its_own() {
        let mut c = connection(|command| match command[0].as_str() {
            "GET" if command[1] == "bad" => b"-WRONGTYPE not a string\r\n".to_vec(),
            "GET" => b"$2\r\n42\r\n".to_vec(),
            "ECHO" => echo_of(command),
            _ => b"-ERR unexpected\r\n".to_vec(),
        })
        .await;
        let mut read = redis::cmd("GET");
        read.arg("ns:tag:{t}");
        let got: Option<Option<String>> = query_echoed(&read, &mut c, Echo::plain()).await.unwrap();
        assert_eq!(got, Some(Some("42".to_string())));
        let mut bad = redis::cmd("GET");
        bad.arg("bad");
        let e = query_echoed::<Option<String>>(&bad, &mut c, Echo::plain())
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some("WRONGTYPE"));
    }

    /// In step: the script's reply; NOSCRIPT loads the script and calls it again; an error
    /// reply is the script's error.
    #[tokio::test(flavor = "current_thread")]
    async fn an_aligned_script_reply_is_read_and_noscript_loads_it() {
        let script = redis::Script::new("return 7");
        let (loaded, answer) = loading_first(&script, |command| match command[0].as_str() {
            "EVALSHA" if command.last().map(String::as_str) == Some("bad") => {
                b"-ERR the script failed\r\n".to_vec()
            }
            "EVALSHA" => b":7\r\n".to_vec(),
            "ECHO" => echo_of(command),
            _ => b"-ERR unexpected\r\n".to_vec(),
        });
        let mut c = connection(answer).await;
        let call = script.key("k");
        let got: Option<i64> = invoke_echoed(&call, &mut c, Echo::plain()).await.unwrap();
        assert_eq!(got, Some(7));
        assert!(loaded.load(std::sync::atomic::Ordering::SeqCst));
        let mut bad = script.key("k");
        bad.arg("bad");
        let e = invoke_echoed::<i64>(&bad, &mut c, Echo::plain())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("the script failed"), "{e}");
    }

    /// What `echo.lua` answers: its ARGV[1] (`EVAL code 1 key mark`).
    fn keyed_echo_of(command: &[String]) -> Vec<u8> {
        assert_eq!(
            command[1],
            *crate::store::redis::scripts::ECHO,
            "{command:?}"
        );
        assert_eq!(command[2], "1", "one key declared: {command:?}");
        format!("${}\r\n{}\r\n", command[4].len(), command[4]).into_bytes()
    }

    /// A Cluster's echo is `echo.lua` declaring the guarded command's key, so the Cluster client
    /// routes it with the command; a script reply moved by an extra one in front lands in its
    /// place and is refused, as on a single server.
    #[tokio::test(flavor = "current_thread")]
    async fn a_keyed_echo_names_the_command_key_and_refuses_a_moved_reply() {
        let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = sent.clone();
        let mut c = connection(move |command| {
            seen.lock().unwrap().push(command.to_vec());
            match command[0].as_str() {
                "EVALSHA" => MOVED_BIDS.to_vec(),
                "EVAL" => keyed_echo_of(command),
                _ => b"-ERR unexpected\r\n".to_vec(),
            }
        })
        .await;
        let script = redis::Script::new("return 1");
        let call = script.key("ns:v:{k}");
        let got: Option<Vec<Value>> = invoke_echoed(&call, &mut c, Echo::keyed("ns:v:{k}"))
            .await
            .unwrap();
        assert_eq!(got, None);
        let sent = sent.lock().unwrap();
        let echo = sent
            .iter()
            .find(|c| c[0] == "EVAL")
            .expect("the echo was sent");
        assert_eq!(echo[3], "ns:v:{k}", "the echo declares the command's key");
        assert_eq!(
            redis::cluster_routing::Slot::for_key(echo[3].as_bytes()),
            redis::cluster_routing::Slot::for_key(b"ns:v:{k}")
        );
    }

    /// In step, a keyed echo lets the reply through: a GET's value, a clock's, a script's
    /// after NOSCRIPT loaded it (the echo itself, sent by EVAL, never meets NOSCRIPT).
    #[tokio::test(flavor = "current_thread")]
    async fn an_aligned_reply_passes_a_keyed_echo() {
        let script = redis::Script::new("return 7");
        let (_, answer) = loading_first(&script, |command| match command[0].as_str() {
            "EVALSHA" => b":7\r\n".to_vec(),
            "HGET" => b"$2\r\n42\r\n".to_vec(),
            "EVAL" => keyed_echo_of(command),
            _ => b"-ERR unexpected\r\n".to_vec(),
        });
        let mut c = connection(answer).await;
        let call = script.key("ns:v:{k}");
        let got: Option<i64> = invoke_echoed(&call, &mut c, Echo::keyed("ns:v:{k}"))
            .await
            .unwrap();
        assert_eq!(got, Some(7));
        let mut read = redis::cmd("HGET");
        read.arg("ns:meta").arg("clock");
        let got: Option<Option<String>> = query_echoed(&read, &mut c, Echo::keyed("ns:meta"))
            .await
            .unwrap();
        assert_eq!(got, Some(Some("42".to_string())));
    }
}
