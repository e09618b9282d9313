//! Envelopes in Redis: reads, and writes fenced against newer state. A key's fence is its
//! generation key (written by `set` and `delete`) plus the generation inside its envelope (new
//! with every write). A load's result is written only if the fence is still the one the load
//! began from (`write_back.lua`), so neither a `set` or `delete` since, nor the result of a
//! load that took over an expired lock, is ever overwritten. A `clear` or `deleteByTag` since
//! the load began makes its result dead on arrival instead (see `tags.rs`).

use std::time::Duration;

use redis::Value;

use super::{lock::Fence, new_token, RedisTier, Remote, Unavailable};
use crate::clock::{Clock, SystemClock};
use crate::envelope::{Body, Envelope, Fmt, Serializer, State};
use crate::inbox::{tag_bucket, Stamp};

/// How long a generation key lives after the `set`/`delete` that wrote it. A load whose fence is
/// older than this (less a margin) is not written back: a generation key written after the
/// load began may have expired by then, and the load would not see that it was fenced.
pub const GENERATION_TTL: Duration = Duration::from_secs(600);
const GENERATION_MARGIN: Duration = Duration::from_secs(30);

/// A fresh number for a GET's ECHO (see `fetch_uncounted`).
pub(super) fn next_echo() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .to_string()
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
/// expired. Anything else (other JSON, another Redis type, bytes that are not UTF-8, another
/// serializer's value, expired by our clock) is `Ok(None)`: a miss, never an error. One that
/// names another key is `Err(Misdelivered)`.
pub fn usable(
    bytes: &[u8],
    serializer: Serializer,
    value_key: &str,
) -> Result<Option<Usable>, Misdelivered> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Ok(None);
    };
    let Some(d) = Envelope::decode(text) else {
        return Ok(None);
    };
    if !d.written_for(value_key) {
        return Err(Misdelivered);
    }
    if d.envelope.state(SystemClock.now_ms()) == State::Expired || !serializer.reads(d.fmt) {
        return Ok(None);
    }
    Ok(Some(Usable {
        envelope: d.envelope,
        value_json: d.value_json.map(str::to_string),
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
        // Off a Cluster, the GET travels with an ECHO of a fresh number: an extra reply in front
        // of ours (an old reply of this very key, which its key mark cannot tell) moves ours
        // into the echo's place, and the read is refused. A Cluster routes a keyless command
        // apart, so there the key mark alone stands guard.
        let echo = (!self.link.topology.is_cluster()).then(next_echo);
        let raw = self
            .run("get", key, |mut c| async move {
                let got = match &echo {
                    None => redis::cmd("GET")
                        .arg(&vkey)
                        .query_async::<Option<Vec<u8>>>(&mut c)
                        .await
                        .map(|v| (v, true)),
                    Some(n) => {
                        let replies = redis::pipe()
                            .ignore_errors()
                            .cmd("GET")
                            .arg(&vkey)
                            .cmd("ECHO")
                            .arg(n)
                            .query_async::<Vec<Value>>(&mut c)
                            .await?;
                        let echoed = matches!(replies.get(1), Some(Value::BulkString(b)) if b == n.as_bytes());
                        match replies.into_iter().next() {
                            _ if !echoed => Ok((None, false)),
                            Some(Value::BulkString(b)) => Ok((Some(b), true)),
                            Some(Value::Nil) => Ok((None, true)),
                            Some(Value::ServerError(e)) => Err(e.into()),
                            // A reply no GET gives: out of step.
                            _ => Ok((None, false)),
                        }
                    }
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
            Ok(Some(bytes)) => match usable(&bytes, self.serializer, &self.value_key(key)) {
                Ok(Some(found)) => found,
                Ok(None) => return Fetched::Missing,
                Err(Misdelivered) => {
                    self.misdelivered("get", key);
                    return Fetched::Missing;
                }
            },
        };
        match self.alive(key, found.envelope.born, &found.tags).await {
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
        let too_old = fence.is_some_and(|f| {
            self.fence_time() - f.read_at_ms
                >= (GENERATION_TTL - GENERATION_MARGIN).as_millis() as f64
        });
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
        let keys = (
            self.value_key(key),
            self.lock_key(key),
            self.generation_key(key),
        );
        let text = envelope.encode(body, &new_token(), &keys.0);
        let msg = self.announcement(key);
        // Published instead of `msg` when the script writes: other processes then have the
        // value without reading it (see `carried.rs`).
        let carrying = self.carrying_announcement(key, &text, !body.tags.is_empty());
        self.carried.expect_own(key);
        let written = self
            .run("set", key, |mut c| async move {
                self.scripts
                    .write_back
                    .key(&keys.0)
                    .key(&keys.1)
                    .key(&keys.2)
                    .arg(&text)
                    .arg(px)
                    .arg(token.unwrap_or(""))
                    .arg(&fence.state)
                    .arg(if forced { "1" } else { "0" })
                    .arg(&self.channel)
                    .arg(&msg)
                    .arg(&carrying)
                    .invoke_async::<i64>(&mut c)
                    .await
            })
            .await;
        match written {
            Ok(1) => WriteBack::Written,
            Ok(_) => {
                if token.is_none() {
                    // Dropped without a lock to release: the script announced nothing.
                    self.carried.own_heard(key);
                }
                WriteBack::Dropped
            }
            Err(Unavailable) => {
                // The script may not have run: free the lock if it is still ours.
                if let Some(token) = token {
                    self.release(key, token, true).await;
                }
                WriteBack::Unavailable
            }
        }
    }

    /// `set` (`Some`) or `delete` (`None`): the newest state of the key, with a new generation
    /// that drops every load that began before. `Ok(existed)`: whether a value key was there.
    /// A set's entry is born at the namespace clock known when it runs (after every earlier
    /// deleteByTag and clear of this instance); Redis's clock is read alongside, and if it was
    /// ahead (one elsewhere, not yet heard of here) the entry's born is raised to it, so a set
    /// made after a deleteByTag elsewhere is never taken for older than it. Run it through
    /// `in_order`.
    pub async fn write(
        &self,
        key: &str,
        written: Option<(&Envelope, &Body<'_>)>,
    ) -> Result<bool, Unavailable> {
        let generation = new_token();
        let (text, px, born) = match written {
            Some((envelope, body)) => {
                let born = envelope.born.max(self.inbox.clock());
                (
                    envelope
                        .born_at(born)
                        .encode(body, &generation, &self.value_key(key)),
                    envelope.remaining_ms(SystemClock.now_ms()),
                    Some(born),
                )
            }
            None => (String::new(), 1, None),
        };
        let keys = (self.value_key(key), self.generation_key(key));
        let msg = self.announcement(key);
        let op = if written.is_some() { "set" } else { "delete" };
        let vkey = keys.0.clone();
        self.carried.expect_own(key);
        let wrote = self.run(op, key, |mut c| async move {
            self.scripts
                .write
                .key(&keys.0)
                .key(&keys.1)
                .arg(&text)
                .arg(px)
                .arg(new_token())
                .arg(GENERATION_TTL.as_millis() as u64)
                .arg(&self.channel)
                .arg(&msg)
                .invoke_async::<i64>(&mut c)
                .await
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
        let existed = existed?;
        if let (Some(born), Some(clock)) = (born, clock) {
            if clock > born {
                let _ = self
                    .run(op, key, |mut c| async move {
                        self.scripts
                            .reborn
                            .key(&vkey)
                            .arg(&generation)
                            .arg(clock)
                            .invoke_async::<i64>(&mut c)
                            .await
                    })
                    .await;
            }
        }
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
                        .query_async::<Option<String>>(&mut c)
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
        let mut envelope = d.envelope;
        envelope.retry_after = envelope.retry_after.max(retry_after);
        let replacement = envelope.encode(&d.body(), d.generation, &vkey);
        let _ = self
            .run("set", key, |mut c| async move {
                self.scripts
                    .replace
                    .key(&vkey)
                    .arg(&text)
                    .arg(&replacement)
                    .invoke_async::<i64>(&mut c)
                    .await
            })
            .await;
    }
}
