//! The read lane's event-loop side (see `store::redis::lane`): a read is written to the lane's
//! socket in the call that asks for it, and its answer settles the promise in the event loop's
//! callback, with no runtime thread in between. Its rooms:
//! - this file: what a read sent on a lane asked, and the lane's state;
//! - `slot`: an engine's lane (or a Cluster engine's lanes, one per master): opening, installing,
//!   reopening after its tier replaced its command connection;
//! - `state`: sending reads, the alignment marks, framing replies and delivering them, shutting;
//! - `libuv`: the libuv lane (Node): the socket watched by the JS thread's own libuv loop (a
//!   `uv_poll_t`), a `uv_timer_t` bounding every read by the command timeout, TLS, and every raw
//!   libuv call and the N-API calls around the loop's callbacks, each with its SAFETY argument;
//! - `socket`: the socket lane (Bun, Deno: their `uv_*` are not libuv's), a socket of the
//!   runtime's own driven by `lib/lane.js`, whose chunks are framed here, one call each.
//!
//! libuv's functions are looked up in the host process (Node exports them for addons); where
//! they are not found (not Unix, or a host that does not export them) there is no libuv lane.
//! The lane opens on the runtime (connect, AUTH, SELECT) while reads take the command
//! connection; the first read after it opened installs it.

mod libuv;
mod slot;
mod socket;
mod state;

pub use slot::{ready, ready_node, LaneSlot, NodeLanes};
pub use socket::closing_in_finalizer;

use libuv::{uv, BATCH};
use socket::{
    call_write, end_unended, socket_lane_only, socket_opener_registered, SocketIo, FINALIZING,
    HOLDING, SOCKET_LANES, UNENDED,
};

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::io::{self, Write};
use std::ptr;
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use napi::bindgen_prelude::*;
use napi::sys;

use super::settle::{self, Promised};
use crate::inbox::Stamp;
use crate::store::redis::{
    frame, frame_values, handshake_reply, Landing, LaneNode, LaneRead, LaneSocket, LaneStream,
    LaneTarget, MarkRule, Opened, RedisTier, PROBE_INTERVAL,
};
use crate::sync::LockOrRecover;

/// Why a lane is shut.
enum Failure {
    /// Its connection failed: the reads are asked again on the command connection.
    Lost(String),
    /// A read outlived the command timeout: Redis is down.
    TimedOut(String),
}

/// What a read sent on the read lane was for.
#[derive(Clone, Copy)]
pub enum LaneAsk {
    /// A cold load's gate (`redisGate`, `PURPOSE_COLD`) for flight `flight` of engine `id`.
    Cold { id: u32, flight: u64 },
    /// `redisFetch`.
    Fetch { count: bool },
}

impl LaneAsk {
    pub fn counted(self) -> bool {
        matches!(self, LaneAsk::Fetch { count: true })
    }
}

/// What the asker does with a read's answer, on the JS thread in a handle scope (`None`: the
/// lane failed or closed before it answered). A function the asker gives, so this module knows
/// nothing of what a read is for.
pub type Then = fn(sys::napi_env, &Arc<RedisTier>, Promised, LaneGet, Option<LaneRead>);

/// A GET sent on the lane: the key, its stamp (taken on the JS thread when the read was asked)
/// and what the read is for; handed back to [`Then`] with the answer.
pub struct LaneGet {
    pub key: String,
    pub stamp: Stamp,
    pub ask: LaneAsk,
}

/// What the asker of a batch read (`Asked::Many`) does with its answer, on the JS thread in a
/// handle scope: the keys and stamps it gave, and what each key's value means (`None`: the lane
/// failed or closed before it answered, or the reply was not the batch's).
pub type ThenMany = Box<
    dyn FnOnce(
        sys::napi_env,
        &Arc<RedisTier>,
        Promised,
        Vec<String>,
        Vec<Stamp>,
        Option<Vec<LaneRead>>,
    ),
>;

/// What a read sent on the lane asked.
pub enum Asked {
    /// A GET of one key.
    One { get: LaneGet, then: Then },
    /// One MGET of many keys (`count`: each counted as an l2Hit or a miss).
    Many {
        keys: Vec<String>,
        stamps: Vec<Stamp>,
        count: bool,
        then: ThenMany,
    },
}

/// A read's reply, framed and judged, until its batch's mark proves it aligned.
enum Framed {
    One(LaneRead),
    Many(Vec<LaneRead>),
}

/// A read sent on the lane, waiting for its reply (replies come in the order reads were sent).
struct Sent {
    promised: Promised,
    asked: Asked,
    deadline: Instant,
}

impl Sent {
    /// The keys it reads.
    fn keys(&self) -> impl Iterator<Item = &str> {
        let (one, many) = match &self.asked {
            Asked::One { get, .. } => (Some(get.key.as_str()), &[][..]),
            Asked::Many { keys, .. } => (None, &keys[..]),
        };
        one.into_iter().chain(many.iter().map(String::as_str))
    }

    /// Its first key (for reports).
    fn key(&self) -> Option<&str> {
        match &self.asked {
            Asked::One { get, .. } => Some(&get.key),
            Asked::Many { keys, .. } => keys.first().map(String::as_str),
        }
    }

    /// Hands the answer to the asker (`None`: ask again on the command connection).
    fn answer(self, env: sys::napi_env, tier: &Arc<RedisTier>, framed: Option<Framed>) {
        match self.asked {
            Asked::One { get, then } => {
                let read = match framed {
                    Some(Framed::One(read)) => Some(read),
                    _ => None,
                };
                then(env, tier, self.promised, get, read);
            }
            Asked::Many {
                keys, stamps, then, ..
            } => {
                let reads = match framed {
                    Some(Framed::Many(reads)) => Some(reads),
                    _ => None,
                };
                then(env, tier, self.promised, keys, stamps, reads);
            }
        }
    }
}

pub struct Lane {
    env: sys::napi_env,
    tier: Arc<RedisTier>,
    /// A socket lane's connection (the runtime's own socket, driven by `lib/lane.js`); `None`
    /// for a libuv lane, whose `stream`, `poll` and `timer` are then live.
    socket: Option<SocketIo>,
    /// The socket; closed (`None`) as soon as its poll handle has closed, whoever still holds
    /// the lane (see `on_close_poll`).
    stream: Option<LaneStream>,
    /// The TLS session over `stream`, driven here: requests are encrypted into it and its
    /// records written out; records read in are decrypted out of it into `input`.
    tls: Option<Box<rustls::ClientConnection>>,
    /// The tier's count of replaced command connections when the lane opened.
    replacement: u64,
    poll: *mut c_void,
    timer: *mut c_void,
    /// Requests not written yet (the socket would have blocked).
    out: Vec<u8>,
    /// Replies not framed yet.
    input: Vec<u8>,
    /// Reads sent and not yet delivered, oldest first. The first `framed.len()` have their
    /// replies framed already, held until the batch's mark proves them aligned.
    sent: VecDeque<Sent>,
    /// What the replies of the first reads of `sent` meant, not yet delivered.
    framed: VecDeque<Framed>,
    /// The marks written after batches of reads (see `mark`): how many reads were sent before
    /// each (counted since the lane opened), and its sequence number, oldest first.
    marks: VecDeque<(u64, u64)>,
    /// Reads written since the lane opened, and delivered since it opened.
    reads_written: u64,
    reads_delivered: u64,
    /// The sequence number of the next mark.
    next_mark: u64,
    /// When the next mark is due (see `mark`).
    rule: MarkRule,
    /// A reply was delivered that no mark has proven yet: if the lane then turns out out of step,
    /// every in-process copy is dropped (`receive`).
    unproven: bool,
    /// Watching for writability too (`out` is not empty).
    writable: bool,
    /// The poll handle keeps the loop alive (while reads are in flight).
    refd: bool,
    timer_armed: bool,
    /// Shut: the handles are closing, nothing is sent.
    shut: bool,
}

/// Set when the host said its event loop is not libuv (Bun and Deno export `uv_*` symbols
/// that abort, or whose loop never polls them): reads take the command connection.
static NOT_LIBUV: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The facade, on a host whose event loop is not genuinely libuv's (Bun, Deno), turns the read
/// lane off for the process: every read takes the command connection, with every guarantee.
#[napi_derive::napi]
pub fn refuse_read_lane() {
    NOT_LIBUV.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Sends `asked` (a GET of one key, or one MGET of a batch's keys, each with its stamp) on
/// `lane` (from `ready`) with the tier's lane timeout: the promise its `then` settles.
pub fn send<'env, T>(
    env: &'env Env,
    lane: &Rc<RefCell<Lane>>,
    tier: &Arc<RedisTier>,
    asked: Asked,
) -> napi::Result<PromiseRaw<'env, T>> {
    let (promised, promise) = settle::promise(env.raw())?;
    Lane::send(
        lane,
        Sent {
            promised,
            asked,
            deadline: Instant::now() + tier.lane_timeout(),
        },
    );
    Ok(PromiseRaw::new(env.raw(), promise))
}
