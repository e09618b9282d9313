//! After a lost bus connection, the in-process copies are checked against Redis instead of all
//! dropped: one pipelined round trip per node reads the start of each copy's value key
//! (`GETRANGE 0 HEADER_BYTES-1`: the 40-byte header; an old JSON envelope's first 256 bytes, in
//! a second round trip for those alone) and each of their tags' records (`GET`), and a copy goes only if
//! its key now holds another write (or none), or a tag of its was deleted after it was born.
//! When the check cannot complete (Redis still unavailable after a few probes' time, replies out
//! of step) every copy goes, as before.
//!
//! Why this and not a log of invalidations: a Lua script may touch only keys of its own slot, so
//! a stream written by the write scripts would not work on Redis Cluster, and a stream written
//! beside them costs every write one more command; `CLIENT TRACKING` needs a RESP3 connection of
//! the server's own choosing per node. Reading what is held costs nothing while the bus is up,
//! and after a blip one round trip per node carrying at most `HEADER_BYTES` per copy, wherever
//! the keys are.

use std::collections::HashMap;

use redis::Value;

use super::batch::Grouping;
use super::{RedisTier, Unavailable, PROBE_INTERVAL};
use crate::envelope::{same_write, HEADER_BYTES, JSON_HEADER_BYTES};
use crate::inbox::tag_bucket;
use crate::store::memory::Held;

/// Copies checked per pipelined call (one reply each).
const CHUNK: usize = 10_000;

/// Attempts at a check, `PROBE_INTERVAL` apart, before every copy is dropped instead.
const VERIFY_TRIES: u32 = 5;

impl RedisTier {
    /// Checks `held` (the in-process copies when the bus came back) against Redis; drops, through
    /// the inbox, each one another instance changed (or every one, if the check fails).
    pub async fn verify_held(&self, held: Vec<Held>) {
        for chunk in held.chunks(CHUNK) {
            let mut tries = 0;
            // The bus is often back before the command connection (both went with the
            // network): Redis is given a few probes' time to answer before everything goes.
            while !self.verify_chunk(chunk).await {
                tries += 1;
                if tries >= VERIFY_TRIES || self.closed() {
                    self.inbox.invalidate_all();
                    return;
                }
                tokio::time::sleep(PROBE_INTERVAL).await;
            }
        }
    }

    /// False when the chunk could not be checked.
    async fn verify_chunk(&self, held: &[Held]) -> bool {
        let mut tags: HashMap<&str, usize> = HashMap::new();
        let mut redis_keys: Vec<String> = held.iter().map(|h| self.value_key(&h.key)).collect();
        let mut names: Vec<&str> = held.iter().map(|h| h.key.as_str()).collect();
        for h in held {
            for tag in &h.tags {
                if !tags.contains_key(tag.as_str()) {
                    tags.insert(tag, redis_keys.len());
                    redis_keys.push(self.tag_key(tag));
                    names.push(h.key.as_str());
                }
            }
        }
        let copies = held.len();
        let header = |bytes: usize| {
            let redis_keys = &redis_keys;
            move |i: usize| {
                let mut c;
                if i < copies {
                    c = redis::cmd("GETRANGE");
                    c.arg(&redis_keys[i]).arg(0).arg(bytes - 1);
                } else {
                    c = redis::cmd("GET");
                    c.arg(&redis_keys[i]);
                }
                c
            }
        };
        let all: Vec<usize> = (0..redis_keys.len()).collect();
        let Some(mut replies) = self
            .read_each(&redis_keys, &names, &all, header(HEADER_BYTES))
            .await
        else {
            return false;
        };
        // A value an earlier version wrote as JSON (during a rolling deploy) spells its fields
        // out: those few are read again, further.
        let json: Vec<usize> = (0..copies)
            .filter(
                |&i| matches!(&replies[i], Ok(Value::BulkString(b)) if b.first() == Some(&b'{')),
            )
            .collect();
        if !json.is_empty() {
            let Some(mut again) = self
                .read_each(&redis_keys, &names, &json, header(JSON_HEADER_BYTES))
                .await
            else {
                return false;
            };
            for &i in &json {
                replies[i] = std::mem::replace(&mut again[i], Ok(Value::Nil));
            }
        }
        // Deletions of the copies' tags first: the copies born before them read as dead.
        for (tag, &i) in &tags {
            let clock = match &replies[i] {
                Ok(Value::BulkString(b)) => std::str::from_utf8(b)
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok()),
                _ => None,
            };
            if let Some(clock) = clock {
                self.inbox.invalidate_tag(tag_bucket(tag), clock);
            }
        }
        for ((h, reply), vkey) in held.iter().zip(&replies).zip(&redis_keys) {
            let same =
                matches!(reply, Ok(Value::BulkString(b)) if same_write(b, &h.envelope, vkey));
            // A copy of this instance's own write that Redis has not taken yet (queued for
            // replay, or unanswered) differs from Redis and is the newer: it stays.
            if !same && !self.writing(&h.key) {
                self.inbox.invalidate(&h.key);
            }
        }
        true
    }

    /// `command(i)` for each `i` of `which`, one pipeline per node (a node's pipeline it
    /// redirected goes again by slot): the replies by index of `redis_keys` (`Err` for those not
    /// in `which`); `None` when they could not all be read.
    async fn read_each(
        &self,
        redis_keys: &[String],
        names: &[&str],
        which: &[usize],
        command: impl Fn(usize) -> redis::Cmd,
    ) -> Option<Vec<Result<Value, Unavailable>>> {
        let mut piped = self
            .pipelined("bus", redis_keys, names, which, Grouping::ByNode, &command)
            .await
            .ok()?;
        if !piped.moved.is_empty() {
            let mut again = self
                .pipelined(
                    "bus",
                    redis_keys,
                    names,
                    &piped.moved,
                    Grouping::BySlot,
                    &command,
                )
                .await
                .ok()?;
            for &i in &piped.moved {
                piped.replies[i] = std::mem::replace(&mut again.replies[i], Ok(Value::Nil));
            }
        }
        which
            .iter()
            .all(|&i| piped.replies[i].is_ok())
            .then_some(piped.replies)
    }
}
