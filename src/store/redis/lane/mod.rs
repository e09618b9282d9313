//! The read lane: a second connection to the one server (or the Sentinel primary, or on a
//! Cluster one per master), over TCP, TLS or a Unix socket, which the hot read path (a `GET` of a
//! key's envelope) takes instead of the command connection. The embedder drives its socket from its own event loop, so a read and its answer
//! cross no thread: on the command connection each read goes JS thread → runtime worker →
//! connection task → JS thread, and a profile put most of a sequential read's time in those
//! wake-ups. Here lives what needs no event loop, in pure Rust that tests reach without Node:
//! the framing of its replies (`resp`), how it connects and authenticates (`transport`, on the
//! runtime, then handed over as a non-blocking socket), whether it may be used, and what a reply
//! means (this file). The embedder's glue (libuv, or a socket of the runtime's own where there
//! is no genuine libuv: `src/node/lane.rs`, `lib/lane.js`) only moves bytes.
//!
//! The lane carries plain GETs only; everything else (a miss that must take the lock, an entry
//! with tags, an error reply) is asked again on the command connection, which knows how to
//! classify failures and wait. A reply that cannot be the read's (another key's entry, a reply
//! no GET gives, anything out of protocol) closes the lane, and every read it still carried is
//! asked again there. A lane that times out takes the tier down as the command connection
//! would; one whose tier replaced its command connection since it opened is dropped too, so
//! both always reach the same server. `STAMPEDE_CACHE_NO_LANE=1` turns it off for a process.

mod marks;
mod resp;
mod transport;

use std::time::Duration;

pub use marks::{MarkRule, Seen, Written};
pub use resp::{frame, frame_values, Reply, Values};
pub use transport::{handshake_reply, Landing, LaneSocket, LaneStream, Opened};

use redis::RedisResult;

use super::envelopes::{usable_marked, Misdelivered};
use super::net::timed_out;
use super::slots::slot_of_key;
use super::{RedisTier, Remote};
use crate::inbox::{tag_bucket, Stamp};
use crate::key;
use crate::store::redis::target::LaneTarget;
use transport::refused;

/// Where a Cluster read's lane goes (`lane_node`).
#[derive(Debug, PartialEq)]
pub enum LaneNode {
    /// The master at this host and port.
    At(String, u16),
    /// The slot map is not known: read it (`read_slot_map`); the command connection reads now.
    Unknown,
    /// No lane for it (the map was refused, or names no address for its slot).
    Nowhere,
}

/// What a lane read found.
#[derive(Debug, PartialEq)]
pub enum LaneRead {
    Found(Remote),
    /// No entry this cache can use (none, another serializer's, expired, dead): a miss, as the
    /// command connection's read would say.
    Missing,
    /// Ask again on the command connection: an entry with tags (their clocks are read there),
    /// the bus down (the clear clock is read there), an error reply.
    Ask,
    /// The reply cannot be this read's: another key's entry, or a reply a GET never gives. The
    /// lane is out of step with its requests: it is closed, and this read and every one after
    /// it are asked again on the command connection.
    Misaligned(&'static str),
}

impl RedisTier {
    /// Whether reads may take the lane now: a plain-TCP server, Redis up, the bus up (an entry
    /// without tags is then alive unless an announcement said otherwise), not closed.
    pub fn lane_usable(&self) -> bool {
        self.link.topology.lane_possible()
            && !self.closed()
            && self.bus_up()
            && self.health.redis_up()
    }

    /// How long a read on the lane may take: the command timeout.
    pub fn lane_timeout(&self) -> Duration {
        self.link.command_timeout
    }

    /// Whether a lane opened at `replacement` still reaches the command connection's server.
    pub fn lane_current(&self, replacement: u64) -> bool {
        self.link.replacements() == replacement
    }

    /// Opens a lane (on the runtime), within the connect timeout.
    pub async fn open_lane(&self) -> RedisResult<LaneSocket> {
        let replacement = self.link.replacements();
        let opened = async {
            let target = self
                .link
                .topology
                .lane_target()
                .await?
                .ok_or_else(|| refused("the server is not reached over TCP".into()))?;
            transport::connect(&target, replacement).await
        };
        tokio::time::timeout(self.link.connect_timeout, opened)
            .await
            .map_err(|_| timed_out("timed out connecting to Redis"))?
    }

    /// Where a socket lane connects now (within the connect timeout), and the tier's command
    /// connection count when it was asked.
    pub async fn socket_lane_target(&self) -> RedisResult<(LaneTarget, u64)> {
        let replacement = self.link.replacements();
        let target =
            tokio::time::timeout(self.link.connect_timeout, self.link.topology.lane_target())
                .await
                .map_err(|_| timed_out("timed out asking where Redis is"))??
                .ok_or_else(|| refused("the server cannot be read on a lane".into()))?;
        Ok((target, replacement))
    }

    /// The connect timeout (a socket lane's opening is bounded by it).
    pub fn lane_connect_timeout(&self) -> Duration {
        self.link.connect_timeout
    }

    /// Whether this tier is a Redis Cluster: reads take a lane per node (`lane_node`).
    pub fn lane_is_cluster(&self) -> bool {
        self.link.topology.is_cluster()
    }

    /// On a Cluster, where the master serving `key`'s value is, by the tier's slot map (the one
    /// batches group keys by). A map that is stale costs a redirect (MOVED, ASK), which the lane
    /// hands to the command connection and which forgets the map.
    pub fn lane_node(&self, key: &str) -> LaneNode {
        match self.link.slot_map() {
            None => LaneNode::Unknown,
            Some(None) => LaneNode::Nowhere,
            Some(Some(map)) => {
                let slot = slot_of_key(self.value_key(key).as_bytes());
                match map.node_of(slot).and_then(|n| map.address_of(n)) {
                    Some((host, port)) => LaneNode::At(host.to_string(), port),
                    None => LaneNode::Nowhere,
                }
            }
        }
    }

    /// Reads the slot map (`CLUSTER SLOTS` on the command connection) for `lane_node`.
    pub async fn read_slot_map(&self) {
        self.slot_map().await;
    }

    /// Opens a lane to the Cluster node at `host`:`port` (on the runtime), within the connect
    /// timeout.
    pub async fn open_lane_to(&self, host: &str, port: u16) -> RedisResult<LaneSocket> {
        let replacement = self.link.replacements();
        let target = self
            .node_lane_target(host, port)
            .ok_or_else(|| refused("the node is not reached over TCP".into()))?;
        tokio::time::timeout(
            self.link.connect_timeout,
            transport::connect(&target, replacement),
        )
        .await
        .map_err(|_| timed_out("timed out connecting to Redis"))?
    }

    /// The target of a socket lane to the Cluster node at `host`:`port`, and the tier's command
    /// connection count now.
    pub fn node_lane_target(&self, host: &str, port: u16) -> Option<LaneTarget> {
        self.link.topology.cluster_lane_target(host, port)
    }

    /// The tier's command connection count now (a lane opened at it is `lane_current`).
    pub fn lane_replacement(&self) -> u64 {
        self.link.replacements()
    }

    /// The request of a lane read of `key`, appended to `out`.
    pub fn lane_request(&self, key: &str, out: &mut Vec<u8>) {
        key::write_value_get(&self.policies.namespace, key, out);
    }

    /// What a lane's mark rule needs to know now (see `marks`): a number that moves whenever
    /// something heard may have changed an entry this process could read (an invalidation heard,
    /// a clear), and the keys this process wrote.
    pub fn lane_seen(&self) -> Seen<'_> {
        Seen {
            changes: self.inbox.heard(),
            written: &self.written,
            now: std::time::Instant::now(),
        }
    }

    /// The lane delivered replies no mark had proven yet and then turned out out of step: every
    /// in-process copy is dropped, so nothing it delivered unproven stays in process.
    pub fn lane_shifted_unproven(&self) {
        self.inbox.invalidate_all();
    }

    /// The mark numbered `seq` that ends a batch of lane reads, appended to `out`: an ECHO,
    /// answered with `seq` as a bulk string (see `lane_mark_answered`).
    pub fn lane_mark(&self, seq: u64, out: &mut Vec<u8>) {
        let n = seq.to_string();
        out.extend_from_slice(format!("*2\r\n$4\r\nECHO\r\n${}\r\n{n}\r\n", n.len()).as_bytes());
    }

    /// Whether `reply` is the echo of mark `seq`; one that is not is counted as a Redis error
    /// (the lane is then closed and its reads asked again).
    pub fn lane_mark_answered(&self, seq: u64, reply: Reply<'_>) -> bool {
        let answered = matches!(reply, Reply::Bulk(b) if b == seq.to_string().as_bytes());
        if !answered {
            self.stats.redis_errors.incr();
        }
        answered
    }

    /// What the lane's reply to a read means. `stamp`: the key's invalidation stamp
    /// when the read was asked for; `count`: a `get()`, counted as an l2Hit or a miss (an `Ask`
    /// is counted where it is asked again).
    pub fn lane_answer(&self, key: &str, stamp: Stamp, reply: Reply<'_>, count: bool) -> LaneRead {
        let read = match reply {
            Reply::Nil => LaneRead::Missing,
            Reply::Error(e) => {
                if e.starts_with(b"MOVED ") || e.starts_with(b"ASK ") {
                    // A Cluster node's lane, routed by a stale map: read it again.
                    self.link.forget_slot_map();
                }
                return LaneRead::Ask;
            }
            Reply::Other => {
                self.stats.redis_errors.incr();
                return LaneRead::Misaligned(
                    "Redis answered a GET on the read lane with a reply a GET never gives",
                );
            }
            Reply::Bulk(bytes) => self.lane_envelope(key, stamp, bytes),
        };
        self.count_lane_read(&read, count);
        read
    }

    /// The request of a batch read of `keys` (one MGET), appended to `out`.
    pub fn lane_request_many(&self, keys: &[String], out: &mut Vec<u8>) {
        key::write_value_mget(&self.policies.namespace, keys, out);
    }

    /// What the lane's reply to a batch read of `keys` (one MGET) means, per key, as
    /// `lane_answer` reads one; `Err` when the reply cannot be this batch's (another key's
    /// entry in any place, or a reply no MGET of these keys gives): the lane is closed and the
    /// batch asked again on the command connection. An error reply (the MGET refused as a
    /// whole) asks every key again there.
    pub fn lane_answer_many(
        &self,
        keys: &[String],
        stamps: &[Stamp],
        reply: Values<'_>,
        count: bool,
    ) -> Result<Vec<LaneRead>, &'static str> {
        let each = match reply {
            Values::Each(each) if each.len() == keys.len() => each,
            Values::Error(_) => return Ok(keys.iter().map(|_| LaneRead::Ask).collect()),
            _ => {
                self.stats.redis_errors.incr();
                return Err("Redis answered an MGET on the read lane with a reply no MGET of its keys gives");
            }
        };
        let mut reads = Vec::with_capacity(keys.len());
        for ((key, stamp), value) in keys.iter().zip(stamps).zip(each) {
            let read = match value {
                None => LaneRead::Missing,
                Some(bytes) => self.lane_envelope(key, *stamp, bytes),
            };
            if let LaneRead::Misaligned(why) = read {
                return Err(why);
            }
            reads.push(read);
        }
        for read in &reads {
            self.count_lane_read(read, count);
        }
        Ok(reads)
    }

    /// What a value the lane read for `key` means (its key mark checked: another key's entry
    /// is `Misaligned`, counted as a Redis error).
    fn lane_envelope(&self, key: &str, stamp: Stamp, bytes: &[u8]) -> LaneRead {
        let mark = key::value_key_mark(&self.policies.namespace, key);
        match usable_marked(bytes, self.policies.serializer, mark) {
            Err(Misdelivered) => {
                self.stats.redis_errors.incr();
                LaneRead::Misaligned(
                    "Redis answered a read on the read lane with another key's entry",
                )
            }
            Ok(None) => LaneRead::Missing,
            Ok(Some(found)) => {
                let buckets: Vec<u16> = found.tags.iter().map(|t| tag_bucket(t)).collect();
                if self.inbox.dead(found.envelope.born, &buckets) {
                    LaneRead::Missing
                } else if !found.tags.is_empty() || !self.bus_up() {
                    LaneRead::Ask
                } else {
                    LaneRead::Found(found.remote(stamp))
                }
            }
        }
    }

    /// `count`: a read for `get()`/`getMany()`, counted as an l2Hit or a miss (an `Ask` is
    /// counted where it is asked again).
    fn count_lane_read(&self, read: &LaneRead, count: bool) {
        if !count {
            return;
        }
        match read {
            LaneRead::Found(_) => self.stats.l2_hits.incr(),
            LaneRead::Ask | LaneRead::Misaligned(_) => {}
            LaneRead::Missing => self.stats.misses.incr(),
        }
    }

    /// A read on the lane outlived the command timeout: Redis is down, as the command
    /// connection's timeout would say, until a probe answers (the reads it carried, asked again,
    /// are then served without Redis at once).
    pub fn lane_timed_out(&self, key: Option<&str>, why: String) {
        self.went_down("get", key, why);
    }

    /// The lane's connection failed (closed, reset, out of protocol): reported, but Redis is not
    /// taken down for it. The reads it carried are asked again on the command connection, whose
    /// own failure, if Redis is gone, takes the tier down; a lane killed alone costs nothing.
    pub fn lane_lost(&self, key: Option<&str>, why: String) {
        if self.lane_is_cluster() {
            // A node gone (a failover, say): the map is read again before the next lane read.
            self.link.forget_slot_map();
        }
        self.report("get", key, why);
    }
}
