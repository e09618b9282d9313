//! The read lane's event-loop side (see `store::redis::lane`): its socket is watched by the JS
//! thread's own libuv loop (a `uv_poll_t`), so a read is written to the socket in the call that
//! asks for it, and its answer settles the promise in the loop's callback, with no runtime
//! thread in between. A `uv_timer_t` bounds every read by the command timeout.
//!
//! libuv's functions are looked up in the host process (Node exports them for addons); where
//! they are not found (not Unix, or a host that does not export them) there is no lane, and
//! reads take the command connection as before. The lane opens on the runtime (connect, AUTH,
//! SELECT) while reads take the command connection; the first read after it opened installs it.
//!
//! Every raw libuv call, and the N-API calls around the loop's callbacks, are here, each with
//! its SAFETY argument.

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

/// An engine's read lane.
#[derive(Default)]
pub enum LaneSlot {
    /// None yet; the next read opens one (not before `retry_at`, after a failure).
    #[default]
    Closed,
    Waiting {
        retry_at: Instant,
    },
    /// Opening on the runtime; the result lands here.
    Opening(Opened),
    /// A socket lane's target being looked up on the runtime (see `socket_lane`).
    Resolving(Opened<(LaneTarget, u64)>),
    /// A socket lane connecting and running its handshake.
    Connecting(Rc<RefCell<Lane>>),
    Open(Rc<RefCell<Lane>>),
    /// This host has no libuv to drive one.
    Never,
}

impl LaneSlot {
    /// Closes the lane (the cache closed): reads it carries are asked again on the command
    /// connection, which answers them as a closed cache does.
    pub fn close(&mut self) {
        if let LaneSlot::Open(lane) | LaneSlot::Connecting(lane) =
            std::mem::replace(self, LaneSlot::Never)
        {
            Lane::shut(&lane, None);
        }
    }
}

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
pub type Then =
    fn(sys::napi_env, &Arc<RedisTier>, Promised, String, Stamp, LaneAsk, Option<LaneRead>);

/// What the asker of a batch read (`send_many`) does with its answer, on the JS thread in a
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
enum Asked {
    /// A GET of one key.
    One {
        key: String,
        stamp: Stamp,
        ask: LaneAsk,
        then: Then,
    },
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
            Asked::One { key, .. } => (Some(key.as_str()), &[][..]),
            Asked::Many { keys, .. } => (None, &keys[..]),
        };
        one.into_iter().chain(many.iter().map(String::as_str))
    }

    /// Its first key (for reports).
    fn key(&self) -> Option<&str> {
        match &self.asked {
            Asked::One { key, .. } => Some(key),
            Asked::Many { keys, .. } => keys.first().map(String::as_str),
        }
    }

    /// Hands the answer to the asker (`None`: ask again on the command connection).
    fn answer(self, env: sys::napi_env, tier: &Arc<RedisTier>, framed: Option<Framed>) {
        match self.asked {
            Asked::One {
                key,
                stamp,
                ask,
                then,
            } => {
                let read = match framed {
                    Some(Framed::One(read)) => Some(read),
                    _ => None,
                };
                then(env, tier, self.promised, key, stamp, ask, read);
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

/// Opens, installs or returns the engine's lane (`slot`): `None` if it cannot take a read now
/// (the caller asks on the command connection). Send on it with `send`, once the engine is no
/// longer borrowed (a read the lane answers at once settles through the asker's `Then`).
///
/// Two transports: the libuv lane (Node: TCP, TLS or a Unix socket) drives its socket from the
/// loop itself; the socket lane (Bun and Deno, whose `uv_*` are not libuv's) is a socket of the
/// runtime's own (`lib/lane.js`), whose chunks are framed here, one call each. Measured under
/// Node, the libuv lane spent 10.5-11.8 µs of CPU per sequential read where the socket lane
/// spent 12.9-13.5 µs (ioredis 11.3-12.0 µs): both are kept.
pub fn ready(env: &Env, slot: &mut LaneSlot, tier: &Arc<RedisTier>) -> Option<Rc<RefCell<Lane>>> {
    if tier.lane_is_cluster() {
        // A Cluster reads on a lane per node (`ready_node`).
        return None;
    }
    ready_at(env, slot, tier, None)
}

/// A Cluster engine's lanes, one per master its reads went to.
#[derive(Default)]
pub struct NodeLanes {
    lanes: std::collections::HashMap<(String, u16), LaneSlot>,
    /// When the slot map was last asked for, and whether that read is still running: one at a
    /// time, at most one every `MAP_INTERVAL`.
    map_asked: Option<Instant>,
    map_reading: Arc<std::sync::atomic::AtomicBool>,
}

/// The least time between two reads of the slot map for the lanes (after a redirect).
const MAP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

/// The most node lanes an engine opens: far above the masters of a real cluster's reads
/// (beyond it, reads take the command connection), low enough that a slot map naming
/// thousands of nodes cannot make it open thousands of sockets.
const MAX_NODE_LANES: usize = 64;

impl NodeLanes {
    /// Closes every node's lane (the cache closed), as `LaneSlot::close` does one.
    pub fn close(&mut self) {
        for slot in self.lanes.values_mut() {
            slot.close();
        }
    }
}

/// On a Cluster, `ready` for the lane to the master serving `key` (by the tier's slot map, read
/// in the background when not known: reads take the command connection meanwhile).
pub fn ready_node(
    env: &Env,
    lanes: &mut NodeLanes,
    tier: &Arc<RedisTier>,
    key: &str,
) -> Option<Rc<RefCell<Lane>>> {
    if !tier.lane_usable() {
        return None;
    }
    match tier.lane_node(key) {
        LaneNode::At(host, port) => {
            let count = lanes.lanes.len();
            let node = (host, port);
            let slot = match lanes.lanes.get_mut(&node) {
                Some(slot) => slot,
                None if count < MAX_NODE_LANES => lanes.lanes.entry(node.clone()).or_default(),
                None => return None,
            };
            ready_at(env, slot, tier, Some((&node.0, node.1)))
        }
        LaneNode::Unknown => {
            use std::sync::atomic::Ordering::Relaxed;
            let due = lanes
                .map_asked
                .is_none_or(|at| at.elapsed() >= MAP_INTERVAL);
            if due && !lanes.map_reading.swap(true, Relaxed) {
                lanes.map_asked = Some(Instant::now());
                let tier = tier.clone();
                let reading = lanes.map_reading.clone();
                napi::bindgen_prelude::spawn(async move {
                    tier.read_slot_map().await;
                    reading.store(false, Relaxed);
                });
            }
            None
        }
        LaneNode::Nowhere => None,
    }
}

/// `ready` for the lane in `slot`, to the tier's server, or with `node` to that Cluster node.
fn ready_at(
    env: &Env,
    slot: &mut LaneSlot,
    tier: &Arc<RedisTier>,
    node: Option<(&str, u16)>,
) -> Option<Rc<RefCell<Lane>>> {
    let via_socket = socket_lane_only();
    end_unended(env.raw());
    let uv = if via_socket {
        if !socket_opener_registered() {
            return None;
        }
        None
    } else {
        Some(uv()?)
    };
    if !tier.lane_usable() {
        return None;
    }
    let reopen = |slot: &mut LaneSlot| match (via_socket, node) {
        (true, None) => resolve(slot, tier),
        (true, Some((host, port))) => {
            *slot = match tier.node_lane_target(host, port) {
                Some(target) => LaneSlot::Resolving(Arc::new(Mutex::new(Some(Ok((
                    target,
                    tier.lane_replacement(),
                )))))),
                None => LaneSlot::Never,
            }
        }
        (false, _) => open(slot, tier, node),
    };
    Some(match slot {
        LaneSlot::Never => return None,
        LaneSlot::Open(lane) => {
            let (shut, current) = {
                let l = lane.borrow();
                (l.shut, tier.lane_current(l.replacement))
            };
            if !shut && current {
                lane.clone()
            } else {
                // The tier replaced its command connection (or the lane failed): reopen, so
                // both reach the same server.
                let lane = lane.clone();
                *slot = LaneSlot::Closed;
                Lane::shut(&lane, None);
                reopen(slot);
                return None;
            }
        }
        LaneSlot::Closed => {
            reopen(slot);
            return None;
        }
        LaneSlot::Waiting { retry_at } => {
            if Instant::now() >= *retry_at {
                reopen(slot);
            }
            return None;
        }
        LaneSlot::Resolving(result) => {
            let resolved = result.lock_or_recover().take()?;
            match resolved {
                Ok((target, replacement)) if !target.is_tls() => {
                    if !tier.lane_current(replacement) {
                        reopen(slot);
                        return None;
                    }
                    *slot = match Lane::connect_socket(env.raw(), tier, target, replacement) {
                        Ok(lane) => LaneSlot::Connecting(lane),
                        Err(_) => LaneSlot::Never,
                    };
                }
                // TLS on the runtime's own sockets is not built: reads over TLS there take the
                // command connection.
                Ok(_) => *slot = LaneSlot::Never,
                Err(_) => {
                    *slot = LaneSlot::Waiting {
                        retry_at: Instant::now() + PROBE_INTERVAL,
                    }
                }
            }
            return None;
        }
        LaneSlot::Connecting(lane) => {
            let (shut, open) = {
                let l = lane.borrow();
                (
                    l.shut,
                    l.socket.as_ref().is_some_and(|s| s.handshake.is_empty()),
                )
            };
            if shut {
                // Refused, closed or timed out while connecting: try again later.
                *slot = LaneSlot::Waiting {
                    retry_at: Instant::now() + PROBE_INTERVAL,
                };
                return None;
            }
            if !open {
                return None;
            }
            let lane = lane.clone();
            *slot = LaneSlot::Open(lane.clone());
            if !tier.lane_current(lane.borrow().replacement) {
                *slot = LaneSlot::Closed;
                Lane::shut(&lane, None);
                reopen(slot);
                return None;
            }
            lane
        }
        LaneSlot::Opening(result) => {
            let opened = result.lock_or_recover().take()?;
            let uv = uv?;
            match opened {
                Err(_) => {
                    // The command connection reports Redis's trouble; the lane tries later.
                    *slot = LaneSlot::Waiting {
                        retry_at: Instant::now() + PROBE_INTERVAL,
                    };
                    return None;
                }
                // Opened before the tier replaced its command connection: the server may be
                // gone or demoted (a socket waits here unwatched until a read installs it).
                Ok(socket) if !tier.lane_current(socket.opened_at_replacement) => {
                    drop(socket);
                    reopen(slot);
                    return None;
                }
                Ok(socket) => match Lane::install(uv, env.raw(), tier.clone(), socket) {
                    Ok(lane) => {
                        *slot = LaneSlot::Open(lane.clone());
                        lane
                    }
                    Err(_) => {
                        *slot = LaneSlot::Never;
                        return None;
                    }
                },
            }
        }
    })
}

/// Sends a read of `key` on `lane` (from `ready`): the promise, which `then` settles.
pub fn send<'env, T>(
    env: &'env Env,
    lane: &Rc<RefCell<Lane>>,
    tier: &Arc<RedisTier>,
    key: String,
    stamp: Stamp,
    ask: LaneAsk,
    then: Then,
) -> napi::Result<PromiseRaw<'env, T>> {
    send_asked(
        env,
        lane,
        tier,
        Asked::One {
            key,
            stamp,
            ask,
            then,
        },
    )
}

/// Sends a batch read of `keys` (one MGET; `stamps`: each key's) on `lane` (from `ready`): the
/// promise, which `then` settles. `count`: each key counted as an l2Hit or a miss.
pub fn send_many<'env, T>(
    env: &'env Env,
    lane: &Rc<RefCell<Lane>>,
    tier: &Arc<RedisTier>,
    keys: Vec<String>,
    stamps: Vec<Stamp>,
    count: bool,
    then: ThenMany,
) -> napi::Result<PromiseRaw<'env, T>> {
    send_asked(
        env,
        lane,
        tier,
        Asked::Many {
            keys,
            stamps,
            count,
            then,
        },
    )
}

/// Sends `asked` on `lane` with the tier's lane timeout: the promise its answer settles.
fn send_asked<'env, T>(
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

/// Looks up where a socket lane connects, on the runtime (a Sentinel is asked there).
fn resolve(slot: &mut LaneSlot, tier: &Arc<RedisTier>) {
    let result = Arc::new(Mutex::new(None));
    *slot = LaneSlot::Resolving(result.clone());
    let tier = tier.clone();
    let landing = Landing::new(result);
    napi::bindgen_prelude::spawn(async move {
        landing.land(tier.socket_lane_target().await);
    });
}

/// Opens a libuv lane on the runtime: to the tier's server, or with `node` to that Cluster node.
fn open(slot: &mut LaneSlot, tier: &Arc<RedisTier>, node: Option<(&str, u16)>) {
    let result = Arc::new(Mutex::new(None));
    *slot = LaneSlot::Opening(result.clone());
    let tier = tier.clone();
    let landing = Landing::new(result);
    let node = node.map(|(host, port)| (host.to_string(), port));
    napi::bindgen_prelude::spawn(async move {
        let opened = match node {
            None => tier.open_lane().await,
            Some((host, port)) => tier.open_lane_to(&host, port).await,
        };
        landing.land(opened);
    });
}

impl Lane {
    /// A lane with nothing sent, and no socket yet (`install` and `connect_socket` give it one).
    fn idle(env: sys::napi_env, tier: Arc<RedisTier>, replacement: u64) -> Lane {
        Lane {
            env,
            tier,
            socket: None,
            stream: None,
            tls: None,
            replacement,
            poll: ptr::null_mut(),
            timer: ptr::null_mut(),
            out: Vec::new(),
            input: Vec::with_capacity(16 * 1024),
            sent: VecDeque::new(),
            framed: VecDeque::new(),
            marks: VecDeque::new(),
            reads_written: 0,
            reads_delivered: 0,
            next_mark: 0,
            // The first reads are marked.
            rule: MarkRule::new(Instant::now()),
            unproven: false,
            writable: false,
            refd: false,
            timer_armed: false,
            shut: false,
        }
    }

    fn install(
        uv: &'static Uv,
        env: sys::napi_env,
        tier: Arc<RedisTier>,
        socket: LaneSocket,
    ) -> napi::Result<Rc<RefCell<Lane>>> {
        let mut uv_loop = ptr::null_mut();
        // SAFETY: on the JS thread, inside a napi call on `env`.
        let status = unsafe { sys::napi_get_uv_event_loop(env, &mut uv_loop) };
        if status != sys::Status::napi_ok || uv_loop.is_null() {
            return Err(napi::Error::from_reason("no event loop"));
        }
        let uv_loop = uv_loop.cast::<c_void>();
        // Made here, inside a napi call: the loop's callbacks have no scope to make it in.
        if async_context(env).is_none() {
            return Err(napi::Error::from_reason("napi_async_init failed"));
        }
        let poll = uv.alloc(UV_POLL);
        let timer = uv.alloc(UV_TIMER);
        let fd = raw_fd(&socket.stream);
        // SAFETY: `poll` and `timer` are zeroed blocks of the size libuv gives for their types;
        // `uv_loop` is this thread's loop; `fd` is an open non-blocking socket that the lane
        // owns until both handles have closed.
        let (a, b) = unsafe {
            (
                (uv.poll_init)(uv_loop, poll, fd),
                (uv.timer_init)(uv_loop, timer),
            )
        };
        if a != 0 || b != 0 {
            // SAFETY: never initialized: only freed.
            unsafe {
                uv.free(poll, UV_POLL);
                uv.free(timer, UV_TIMER);
            }
            return Err(napi::Error::from_reason("uv_poll_init failed"));
        }
        let lane = Rc::new(RefCell::new(Lane {
            stream: Some(socket.stream),
            tls: socket.tls,
            poll,
            timer,
            refd: true,
            ..Lane::idle(env, tier, socket.opened_at_replacement)
        }));
        // Each handle holds the lane until its close callback.
        // SAFETY: initialized handles of this thread's loop; their data is a leaked Rc, taken
        // back in `on_close`. The loop is not kept alive by an idle lane.
        unsafe {
            (uv.set_data)(poll, Rc::into_raw(lane.clone()) as *mut c_void);
            (uv.set_data)(timer, Rc::into_raw(lane.clone()) as *mut c_void);
            (uv.poll_start)(poll, UV_READABLE, on_poll);
            (uv.unref)(poll);
            (uv.unref)(timer);
        }
        lane.borrow_mut().refd = false;
        register_for_teardown(env, &lane);
        Ok(lane)
    }

    /// Opens a socket lane to `target`: `lib/lane.js` connects a socket of the runtime's own and
    /// writes the handshake; its replies, framed here (`feed`), open the lane. Inside a napi call.
    fn connect_socket(
        env: sys::napi_env,
        tier: &Arc<RedisTier>,
        target: LaneTarget,
        replacement: u64,
    ) -> napi::Result<Rc<RefCell<Lane>>> {
        let (hello, required) = target.handshake_packed();
        let id = NEXT_SOCKET_LANE.with(|n| {
            let id = n.get();
            n.set(id.wrapping_add(1));
            id
        });
        let (host, port, path) = target.address();
        // SAFETY: on the JS thread, inside a napi call on `env` (a handle scope is open).
        let (write, end) = unsafe {
            call_opener(
                env,
                Opening {
                    id,
                    host,
                    port,
                    path,
                    hello: &hello,
                    connect_ms: tier.lane_connect_timeout().as_millis() as f64,
                    command_ms: tier.lane_timeout().as_millis() as f64,
                },
            )?
        };
        let lane = Rc::new(RefCell::new(Lane {
            socket: Some(SocketIo {
                id,
                write,
                end,
                handshake: required.into(),
            }),
            ..Lane::idle(env, tier.clone(), replacement)
        }));
        SOCKET_LANES.with_borrow_mut(|lanes| lanes.insert(id, Rc::downgrade(&lane)));
        Ok(lane)
    }

    /// A chunk the socket lane's socket read: the handshake's replies first, then the reads'.
    fn feed(&mut self, chunk: &[u8]) -> (Vec<(Sent, Framed)>, Option<String>) {
        self.input.extend_from_slice(chunk);
        if let Some(socket) = self.socket.as_mut() {
            let mut at = 0;
            let mut failure = None;
            while let Some(&required) = socket.handshake.front() {
                match frame(&self.input[at..]) {
                    Ok(Some((reply, len))) => {
                        if let Err(why) = handshake_reply(reply, required) {
                            failure = Some(why);
                            break;
                        }
                        socket.handshake.pop_front();
                        at += len;
                    }
                    Ok(None) => break,
                    Err(_) => {
                        failure = Some("Redis answered the read lane out of protocol".into());
                        break;
                    }
                }
            }
            self.input.drain(..at);
            if failure.is_some() || !socket.handshake.is_empty() {
                return (Vec::new(), failure);
            }
        }
        self.frame_input(None)
    }

    /// Whether a batch read (`send_many`) is in flight on the lane.
    pub fn carrying_batch(&self) -> bool {
        self.sent
            .iter()
            .any(|s| matches!(s.asked, Asked::Many { .. }))
    }

    fn send(lane: &Rc<RefCell<Lane>>, sent: Sent) {
        // A socket lane does not join the libuv lanes' batch: that is written after a libuv
        // callback, outside any napi call, where the socket's `write` cannot be called. In a
        // hold (see `HOLDING`) it writes its first read at once, the rest at the release.
        let socket = lane.borrow().socket.is_some();
        let held = socket
            && HOLDING.with_borrow_mut(|holding| match holding {
                Some(lanes) if lanes.iter().any(|l| Rc::ptr_eq(l, lane)) => true,
                Some(lanes) => {
                    lanes.push(lane.clone());
                    false
                }
                None => false,
            });
        let batching = !socket
            && BATCH.with_borrow_mut(|batch| match batch {
                Some(lanes) => {
                    if !lanes.iter().any(|l| Rc::ptr_eq(l, lane)) {
                        lanes.push(lane.clone());
                    }
                    true
                }
                None => false,
            });
        let failed = {
            let mut l = lane.borrow_mut();
            let l = &mut *l;
            match &sent.asked {
                Asked::One { key, .. } => l.tier.lane_request(key, &mut l.out),
                Asked::Many { keys, .. } => l.tier.lane_request_many(keys, &mut l.out),
            }
            l.sent.push_back(sent);
            l.reads_written += 1;
            let failed = if l.writable || batching || held {
                Ok(())
            } else {
                l.flush()
            };
            l.arm_timer();
            l.update_ref();
            failed
        };
        if let Err(e) = failed {
            Lane::shut(
                lane,
                Some(Failure::Lost(format!("Redis read lane failed: {e}"))),
            );
        }
    }

    /// Ends the batch of reads written since the last mark with a mark of its own (an ECHO of
    /// a sequence number), when one is due. Replies are matched to reads by order only; the
    /// mark's echo, found exactly where it must be, proves that none was added or lost before it
    /// (an extra reply of the same key, which the envelope's key mark cannot tell, included).
    ///
    /// Marks are amortised (`store::redis::lane::marks` has the rule and why it is safe): a
    /// batch goes without one unless it reads a key this process wrote since the last mark,
    /// something was heard since, or 16 reads or 50 ms passed; its replies are then delivered as
    /// they come, and the next mark proves them after the fact. A shift is caught at the latest
    /// by the next mark, and then every in-process copy is dropped, so nothing the lane
    /// delivered unproven stays in process.
    fn mark(&mut self) {
        if self.shut {
            return;
        }
        let seen = self.tier.lane_seen();
        // The reads written since the last decision are the newest sent.
        let undecided = self.rule.undecided(self.reads_written);
        let undecided = self.sent.iter().rev().take(undecided);
        let keys = undecided.flat_map(|s| s.keys());
        if self.rule.decide(self.reads_written, keys, &seen) != Some(true) {
            return;
        }
        let seq = self.next_mark;
        self.next_mark += 1;
        self.tier.lane_mark(seq, &mut self.out);
        self.marks.push_back((self.reads_written, seq));
    }

    /// Whether the read at `position` (counted since the lane opened) is followed by a mark,
    /// so its reply waits for the mark's proof; one that is not is delivered as it comes.
    fn marked(&self, position: u64) -> bool {
        self.marks
            .back()
            .is_some_and(|&(before, _)| before > position)
    }

    /// Writes what it can of `out` (over TLS: encrypts it and writes the records); watches for
    /// writability while some is left. Marks the reads written since the last mark first.
    fn flush(&mut self) -> io::Result<()> {
        self.mark();
        if let Some(socket) = &self.socket {
            if self.out.is_empty() {
                return Ok(());
            }
            // SAFETY: on the JS thread, inside a napi call (a socket lane is only sent on and
            // fed from napi calls).
            let written = unsafe { call_write(self.env, socket.write, &self.out) };
            self.out.clear();
            return written.map_err(|e| io::Error::other(e.reason));
        }
        let want = match &mut self.tls {
            None => {
                let mut stream = connected(&self.stream)?;
                let mut written = 0;
                while written < self.out.len() {
                    match stream.write(&self.out[written..]) {
                        Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                        Ok(n) => written += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                self.out.drain(..written);
                !self.out.is_empty()
            }
            Some(tls) => {
                let mut stream = connected(&self.stream)?;
                let mut taken = 0;
                loop {
                    let before = taken;
                    // The session takes plaintext up to its buffer limit; what it cannot take
                    // waits in `out` until its records are written.
                    while taken < self.out.len() {
                        match tls.writer().write(&self.out[taken..]) {
                            Ok(0) => break,
                            Ok(n) => taken += n,
                            Err(e) => return Err(e),
                        }
                    }
                    let mut blocked = false;
                    let mut wrote = false;
                    while tls.wants_write() {
                        match tls.write_tls(&mut stream) {
                            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                            Ok(_) => wrote = true,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                blocked = true;
                                break;
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(e),
                        }
                    }
                    if blocked || taken == self.out.len() {
                        break;
                    }
                    if taken == before && !wrote {
                        // Neither took nor wrote anything: the session is closed for writing.
                        return Err(io::ErrorKind::WriteZero.into());
                    }
                }
                self.out.drain(..taken);
                !self.out.is_empty() || tls.wants_write()
            }
        };
        if want != self.writable {
            self.writable = want;
            let events = if want {
                UV_READABLE | UV_WRITABLE
            } else {
                UV_READABLE
            };
            let uv = uv().expect("a lane exists only with libuv");
            // SAFETY: the lane's live poll handle (not shut: `shut` closes it and nothing
            // flushes after).
            unsafe { (uv.poll_start)(self.poll, events, on_poll) };
        }
        Ok(())
    }

    /// Reads what the socket has and frames the replies: each settles the oldest read sent.
    /// What was answered before a failure is answered still; the failure is returned with it.
    fn receive(&mut self) -> (Vec<(Sent, Framed)>, Option<String>) {
        let failure = if self.tls.is_some() {
            self.receive_tls()
        } else {
            self.receive_plain()
        };
        self.frame_input(failure)
    }

    /// Frames the replies in `input`: each settles the oldest read sent, once its batch's mark
    /// proves it aligned. `failure`: the read's, returned unless framing finds a worse one.
    fn frame_input(
        &mut self,
        mut failure: Option<String>,
    ) -> (Vec<(Sent, Framed)>, Option<String>) {
        let mut answered = Vec::new();
        let mut at = 0;
        // Failures of the replies' framing below: the lane is out of step.
        let read_failure = failure.is_some();
        while at < self.input.len() {
            let position = self.reads_delivered + self.framed.len() as u64;
            let mark = self
                .marks
                .front()
                .filter(|&&(before, _)| before == position)
                .map(|&(_, seq)| seq);
            let sent = self.sent.get(self.framed.len());
            let framed = match (mark, sent.map(|s| &s.asked)) {
                (
                    None,
                    Some(Asked::Many {
                        keys,
                        stamps,
                        count,
                        ..
                    }),
                ) => {
                    // A batch read: its MGET's reply, one element per key.
                    let (values, len) = match frame_values(&self.input[at..], keys.len()) {
                        Ok(Some(framed)) => framed,
                        Ok(None) => break,
                        Err(_) => {
                            failure = Some("Redis answered the read lane out of protocol".into());
                            break;
                        }
                    };
                    match self.tier.lane_answer_many(keys, stamps, values, *count) {
                        Ok(reads) => (Framed::Many(reads), len),
                        Err(why) => {
                            // Not this batch's answer: every read not delivered is asked again
                            // when the lane shuts.
                            failure = Some(why.to_string());
                            break;
                        }
                    }
                }
                (mark, sent) => {
                    let (reply, len) = match frame(&self.input[at..]) {
                        Ok(Some(framed)) => framed,
                        Ok(None) => break,
                        Err(_) => {
                            failure = Some("Redis answered the read lane out of protocol".into());
                            break;
                        }
                    };
                    if let Some(seq) = mark {
                        // This reply must be the mark's echo; then the batch before it is
                        // aligned.
                        if !self.tier.lane_mark_answered(seq, reply) {
                            failure = Some(
                                "Redis's replies on the read lane are out of step with its requests"
                                    .into(),
                            );
                            break;
                        }
                        self.marks.pop_front();
                        while let Some(read) = self.framed.pop_front() {
                            let sent = self.sent.pop_front().expect("a framed read was sent");
                            answered.push((sent, read));
                        }
                        self.reads_delivered = position;
                        // Everything delivered so far came before this mark: proven.
                        self.unproven = false;
                        at += len;
                        continue;
                    }
                    let Some(Asked::One {
                        key, stamp, ask, ..
                    }) = sent
                    else {
                        failure = Some("Redis answered a read the lane did not send".into());
                        break;
                    };
                    let read = self.tier.lane_answer(key, *stamp, reply, ask.counted());
                    if let LaneRead::Misaligned(why) = read {
                        // Not this read's answer: every read not delivered is asked again when
                        // the lane shuts.
                        failure = Some(why.to_string());
                        break;
                    }
                    (Framed::One(read), len)
                }
            };
            let (read, len) = framed;
            at += len;
            if self.framed.is_empty() && !self.marked(position) {
                // No mark after it (see `mark`): delivered now, proven by the next mark.
                let sent = self.sent.pop_front().expect("a framed read was sent");
                answered.push((sent, read));
                self.reads_delivered = position + 1;
                self.unproven = true;
                continue;
            }
            self.framed.push_back(read);
        }
        if failure.is_some() && !read_failure && self.unproven {
            // Out of step after delivering replies no mark proved: none of them stays in process.
            self.tier.lane_shifted_unproven();
            self.unproven = false;
        }
        self.input.drain(..at);
        if self.input.is_empty() && self.input.capacity() > 1024 * 1024 {
            // A large value passed: give its buffer back.
            self.input = Vec::with_capacity(16 * 1024);
        }
        self.update_ref();
        (answered, failure)
    }

    /// Reads what the socket has into `input`; a failure, if it failed.
    fn receive_plain(&mut self) -> Option<String> {
        loop {
            if self.input.capacity() - self.input.len() < 4096 {
                self.input.reserve(16 * 1024);
            }
            let spare = self.input.capacity() - self.input.len();
            let stream = match connected(&self.stream) {
                Ok(stream) => stream,
                Err(e) => return Some(format!("Redis read lane failed: {e}")),
            };
            match read_into_spare(stream, &mut self.input) {
                Ok(0) => return Some("Redis closed the read lane".to_string()),
                // Short of the space given: the socket is drained for now.
                Ok(n) if n < spare => return None,
                Ok(_) => {}
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock => return None,
                    io::ErrorKind::Interrupted => {}
                    _ => return Some(format!("Redis read lane failed: {e}")),
                },
            }
        }
    }

    /// Reads the records the socket has into the TLS session, and its plaintext into `input`
    /// (replies that arrived are delivered even when a failure follows them). A failure, if any.
    fn receive_tls(&mut self) -> Option<String> {
        use std::io::BufRead;
        let tls = self.tls.as_mut()?;
        let mut stream = match connected(&self.stream) {
            Ok(stream) => stream,
            Err(e) => return Some(format!("Redis read lane failed: {e}")),
        };
        loop {
            let mut failure = None;
            let mut drained = false;
            match tls.read_tls(&mut stream) {
                // The TCP end: the reader below says whether TLS closed cleanly first.
                Ok(0) => drained = true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => drained = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => failure = Some(format!("Redis read lane failed: {e}")),
            }
            if let Err(e) = tls.process_new_packets() {
                failure.get_or_insert_with(|| format!("Redis read lane failed (TLS): {e}"));
            }
            loop {
                let mut reader = tls.reader();
                match reader.fill_buf() {
                    Ok([]) => {
                        failure.get_or_insert_with(|| "Redis closed the read lane".to_string());
                        break;
                    }
                    Ok(chunk) => {
                        let n = chunk.len();
                        self.input.extend_from_slice(chunk);
                        reader.consume(n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        failure.get_or_insert_with(|| format!("Redis read lane failed: {e}"));
                        break;
                    }
                }
            }
            if failure.is_some() {
                return failure;
            }
            if drained {
                break;
            }
        }
        // The session may have something to say back (a key update): written with the requests.
        if tls.wants_write() {
            if let Err(e) = self.flush() {
                return Some(format!("Redis read lane failed: {e}"));
            }
        }
        None
    }

    fn arm_timer(&mut self) {
        // A socket lane's timer is `lib/lane.js`'s, armed as it writes (see `lane_timer`).
        if self.timer_armed || self.shut || self.socket.is_some() {
            return;
        }
        let Some(first) = self.sent.front() else {
            return;
        };
        let left = first.deadline.saturating_duration_since(Instant::now());
        self.timer_armed = true;
        let uv = uv().expect("a lane exists only with libuv");
        // SAFETY: the lane's live timer handle; +1 ms so it fires after the deadline.
        unsafe { (uv.timer_start)(self.timer, on_timer, left.as_millis() as u64 + 1, 0) };
    }

    fn update_ref(&mut self) {
        // A socket lane's socket is held by `lib/lane.js` while it writes, let go when
        // `lane_data` says no read is left in flight.
        if self.socket.is_some() {
            return;
        }
        let want = !self.sent.is_empty() && !self.shut;
        if want == self.refd {
            return;
        }
        self.refd = want;
        let uv = uv().expect("a lane exists only with libuv");
        // SAFETY: the lane's poll handle, live until its close callback.
        unsafe {
            if want {
                (uv.ref_)(self.poll)
            } else {
                (uv.unref)(self.poll)
            }
        }
    }

    /// Closes the lane: its handles close (the socket with them), and the reads it carries are
    /// asked again on the command connection. `failure`: why, when it failed.
    fn shut(lane: &Rc<RefCell<Lane>>, failure: Option<Failure>) {
        let (tier, env, left, socket) = {
            let mut l = lane.borrow_mut();
            if l.shut {
                return;
            }
            l.shut = true;
            l.refd = false;
            let socket = l.socket.take();
            if socket.is_none() {
                let uv = uv().expect("a lane exists only with libuv");
                // SAFETY: live handles of this thread's loop, closed once (`shut` guards);
                // their close callbacks free them and drop the lane's references.
                unsafe {
                    (uv.close)(l.poll, Some(on_close_poll));
                    (uv.close)(l.timer, Some(on_close_timer));
                }
            }
            l.input = Vec::new();
            // Framed but not proven aligned: asked again, like the rest.
            l.framed.clear();
            let left: Vec<Sent> = l.sent.drain(..).collect();
            (l.tier.clone(), l.env, left, socket)
        };
        if let Some(socket) = socket {
            SOCKET_LANES.with_borrow_mut(|lanes| lanes.remove(&socket.id));
            if FINALIZING.get() {
                // A cache collected without close(): no JS may run in a finalizer. The socket
                // is ended at this thread's next lane call (and a chunk for it ends it at once).
                UNENDED.with_borrow_mut(|u| u.push(socket));
            } else {
                // SAFETY: a socket lane is shut on the JS thread inside a napi call (a read, a
                // chunk, its timer, close()); the references are this lane's, released once.
                unsafe { socket.end(env) };
            }
        }
        let key = left.first().and_then(Sent::key);
        match failure {
            Some(Failure::Lost(why)) => tier.lane_lost(key, why),
            Some(Failure::TimedOut(why)) => tier.lane_timed_out(key, why),
            None => {}
        }
        for s in left {
            s.answer(env, &tier, None);
        }
    }
}

/// The loop's callback: the socket is readable (or writable, or failed).
unsafe extern "C" fn on_poll(handle: *mut c_void, status: c_int, events: c_int) {
    // SAFETY: the handle's data is the lane's Rc until `on_close_poll`, and libuv calls no
    // callback of a closing handle.
    let Some(lane) = (unsafe { lane_of(handle) }) else {
        return;
    };
    let (answered, failure) = {
        let mut l = lane.borrow_mut();
        if l.shut {
            return;
        }
        if status < 0 {
            (
                Vec::new(),
                Some(format!("Redis read lane failed (libuv status {status})")),
            )
        } else {
            let flushed = if events & UV_WRITABLE != 0 {
                l.flush()
                    .map_err(|e| format!("Redis read lane failed: {e}"))
            } else {
                Ok(())
            };
            match flushed {
                Ok(()) if events & UV_READABLE != 0 => l.receive(),
                Ok(()) => (Vec::new(), None),
                Err(e) => (Vec::new(), Some(e)),
            }
        }
    };
    deliver(&lane, answered, failure);
}

/// Settles the reads `receive` answered, writes the reads their continuations sent, and shuts
/// the lane if it failed.
fn deliver(lane: &Rc<RefCell<Lane>>, answered: Vec<(Sent, Framed)>, failure: Option<String>) {
    if !answered.is_empty() {
        let (env, tier) = {
            let l = lane.borrow();
            (l.env, l.tier.clone())
        };
        // Reads the settled promises' continuations ask for are written together, after them.
        BATCH.with_borrow_mut(|b| *b = Some(Vec::new()));
        // SAFETY: on the JS thread, in the loop's callback, outside any napi call.
        unsafe {
            in_callback_scope(env, || {
                for (s, read) in answered {
                    s.answer(env, &tier, Some(read));
                }
            })
        };
        let batched = BATCH.with_borrow_mut(Option::take).unwrap_or_default();
        for other in batched {
            let flushed = {
                let mut l = other.borrow_mut();
                if l.shut || l.writable {
                    Ok(())
                } else {
                    l.flush()
                }
            };
            if let Err(e) = flushed {
                Lane::shut(
                    &other,
                    Some(Failure::Lost(format!("Redis read lane failed: {e}"))),
                );
            }
        }
    }
    if let Some(why) = failure {
        Lane::shut(lane, Some(Failure::Lost(why)));
    }
}

/// The timer's callback: the oldest read in flight may have outlived the command timeout.
///
/// libuv runs timers before it polls for I/O, so after the JS thread was blocked (a GC pause,
/// a long synchronous task) this fires before the poll callback that would read the replies
/// waiting in the socket. They are read here first: a reply that arrived in time is used, and
/// only a read still unanswered then has timed out.
unsafe extern "C" fn on_timer(handle: *mut c_void) {
    // SAFETY: as in `on_poll`.
    let Some(lane) = (unsafe { lane_of(handle) }) else {
        return;
    };
    let overdue = {
        let l = lane.borrow();
        !l.shut && l.sent.front().is_some_and(|f| Instant::now() >= f.deadline)
    };
    if overdue {
        let (answered, failure) = lane.borrow_mut().receive();
        deliver(&lane, answered, failure);
    }
    let expired = {
        let mut l = lane.borrow_mut();
        l.timer_armed = false;
        if l.shut {
            return;
        }
        match l.sent.front() {
            Some(first) if Instant::now() >= first.deadline => true,
            _ => {
                l.arm_timer();
                false
            }
        }
    };
    if expired {
        let timeout = lane.borrow().tier.lane_timeout();
        Lane::shut(
            &lane,
            Some(Failure::TimedOut(format!(
                "Redis get timed out after {timeout:?} (read lane)"
            ))),
        );
    }
}

/// The lane a handle's data names (a new reference).
unsafe fn lane_of(handle: *mut c_void) -> Option<Rc<RefCell<Lane>>> {
    let uv = uv()?;
    // SAFETY: the caller's handle is live; its data is an Rc leaked by `install`.
    let data = unsafe { (uv.get_data)(handle) } as *const RefCell<Lane>;
    if data.is_null() {
        return None;
    }
    // SAFETY: the leaked Rc is alive until the handle's close callback.
    unsafe {
        Rc::increment_strong_count(data);
        Some(Rc::from_raw(data))
    }
}

unsafe extern "C" fn on_close_poll(handle: *mut c_void) {
    // The socket closes with its poll handle, not with the last reference to the lane: the
    // engine's slot keeps a shut lane until its next read, which may never come (a cache that
    // serves everything in process), and a server flooding the lane would be left open. libuv
    // watches the fd no more once the handle has closed.
    // SAFETY: the handle's data is still the lane's Rc (taken back just below).
    if let Some(lane) = unsafe { lane_of(handle) } {
        if let Ok(mut l) = lane.try_borrow_mut() {
            l.stream = None;
            l.tls = None;
            l.input = Vec::new();
        }
    }
    // SAFETY: the poll handle closed; nothing refers to it any more.
    unsafe { release_handle(handle, UV_POLL) }
}

unsafe extern "C" fn on_close_timer(handle: *mut c_void) {
    // SAFETY: as in `on_close_poll`.
    unsafe { release_handle(handle, UV_TIMER) }
}

unsafe fn release_handle(handle: *mut c_void, kind: c_int) {
    let Some(uv) = uv() else { return };
    // SAFETY: a closed handle whose data is the Rc leaked by `install`, taken back once.
    unsafe {
        let data = (uv.get_data)(handle) as *const RefCell<Lane>;
        if !data.is_null() {
            drop(Rc::from_raw(data));
        }
        uv.free(handle, kind);
    }
}

/// Runs `f` (which settles promises) the way Node runs a callback: in a handle scope and a
/// callback scope, whose end runs the microtasks the settlements queued.
unsafe fn in_callback_scope(env: sys::napi_env, f: impl FnOnce()) {
    let Some(context) = async_context(env) else {
        return;
    };
    let mut handles = ptr::null_mut();
    // SAFETY: on the JS thread with its live environment, outside any other napi call; scopes
    // are closed in reverse order.
    unsafe {
        if sys::napi_open_handle_scope(env, &mut handles) != sys::Status::napi_ok {
            return;
        }
        let mut resource = ptr::null_mut();
        let mut scope = ptr::null_mut();
        if sys::napi_create_object(env, &mut resource) == sys::Status::napi_ok
            && sys::napi_open_callback_scope(env, resource, context, &mut scope)
                == sys::Status::napi_ok
        {
            f();
            sys::napi_close_callback_scope(env, scope);
        }
        sys::napi_close_handle_scope(env, handles);
    }
}

struct AsyncContext(sys::napi_async_context);

thread_local! {
    /// While the lane's callback settles promises: the lanes that reads were queued on
    /// meanwhile, written once the callback's microtasks have run (one write for many reads).
    static BATCH: RefCell<Option<Vec<Rc<RefCell<Lane>>>>> = const { RefCell::new(None) };
    /// This JS thread's async context for the lane's callbacks, made once.
    static CONTEXT: RefCell<Option<AsyncContext>> = const { RefCell::new(None) };
    /// Lanes open on this thread, closed when its environment is torn down.
    static OPEN: RefCell<Option<Vec<Weak<RefCell<Lane>>>>> = const { RefCell::new(None) };
}

/// This thread's async context, made on first use (inside a napi call).
fn async_context(env: sys::napi_env) -> Option<sys::napi_async_context> {
    CONTEXT.with_borrow_mut(|c| {
        if c.is_none() {
            let name = "stampede-cache:redis-lane";
            let mut js_name = ptr::null_mut();
            let mut context = ptr::null_mut();
            // SAFETY: on the JS thread, in a handle scope; the name is valid UTF-8 of the
            // length given; no resource object (Node makes one).
            let ok = unsafe {
                sys::napi_create_string_utf8(
                    env,
                    name.as_ptr().cast(),
                    name.len() as isize,
                    &mut js_name,
                ) == sys::Status::napi_ok
                    && sys::napi_async_init(env, ptr::null_mut(), js_name, &mut context)
                        == sys::Status::napi_ok
            };
            if !ok {
                return None;
            }
            *c = Some(AsyncContext(context));
        }
        c.as_ref().map(|c| c.0)
    })
}

/// Closes this thread's lanes when its environment goes (a worker thread ending): a loop may
/// not be closed with handles still open.
fn register_for_teardown(env: sys::napi_env, lane: &Rc<RefCell<Lane>>) {
    OPEN.with_borrow_mut(|open| {
        let first = open.is_none();
        let list = open.get_or_insert_with(Vec::new);
        list.retain(|l| l.strong_count() > 0);
        list.push(Rc::downgrade(lane));
        if first {
            // SAFETY: on the JS thread of `env`; the hook takes no data.
            unsafe { sys::napi_add_env_cleanup_hook(env, Some(teardown), ptr::null_mut()) };
        }
    });
}

unsafe extern "C" fn teardown(_arg: *mut c_void) {
    let lanes = OPEN
        .try_with(|open| open.borrow_mut().take())
        .ok()
        .flatten()
        .unwrap_or_default();
    let _ = CONTEXT.try_with(|c| c.borrow_mut().take());
    for lane in lanes.iter().filter_map(Weak::upgrade) {
        // The environment is going: the reads in flight go with it, unsettled.
        let mut l = lane.borrow_mut();
        if l.shut {
            continue;
        }
        l.shut = true;
        l.sent.clear();
        let uv = uv().expect("a lane exists only with libuv");
        // SAFETY: live handles of this thread's loop, closed once (`shut` guards).
        unsafe {
            (uv.close)(l.poll, Some(on_close_poll));
            (uv.close)(l.timer, Some(on_close_timer));
        }
    }
}

// ---- libuv, as the host process exports it ----

const UV_POLL: c_int = 8;
const UV_TIMER: c_int = 13;
const UV_READABLE: c_int = 1;
const UV_WRITABLE: c_int = 2;

type PollCb = unsafe extern "C" fn(*mut c_void, c_int, c_int);
type TimerCb = unsafe extern "C" fn(*mut c_void);
type CloseCb = Option<unsafe extern "C" fn(*mut c_void)>;

type HandleSizeFn = unsafe extern "C" fn(c_int) -> usize;
type PollInitFn = unsafe extern "C" fn(*mut c_void, *mut c_void, c_int) -> c_int;
type PollStartFn = unsafe extern "C" fn(*mut c_void, c_int, PollCb) -> c_int;
type TimerInitFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
type TimerStartFn = unsafe extern "C" fn(*mut c_void, TimerCb, u64, u64) -> c_int;
type CloseFn = unsafe extern "C" fn(*mut c_void, CloseCb);
type HandleFn = unsafe extern "C" fn(*mut c_void);
type SetDataFn = unsafe extern "C" fn(*mut c_void, *mut c_void);
type GetDataFn = unsafe extern "C" fn(*const c_void) -> *mut c_void;

/// The libuv functions the lane uses (stable since libuv 1.19; Node 20 ships 1.46).
struct Uv {
    handle_size: HandleSizeFn,
    poll_init: PollInitFn,
    poll_start: PollStartFn,
    timer_init: TimerInitFn,
    timer_start: TimerStartFn,
    close: CloseFn,
    ref_: HandleFn,
    unref: HandleFn,
    set_data: SetDataFn,
    get_data: GetDataFn,
}

impl Uv {
    fn layout(&self, kind: c_int) -> std::alloc::Layout {
        // SAFETY: uv_handle_size only reads a table.
        let size = unsafe { (self.handle_size)(kind) };
        std::alloc::Layout::from_size_align(size.max(8), 16).expect("a handle's size")
    }

    fn alloc(&self, kind: c_int) -> *mut c_void {
        let layout = self.layout(kind);
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        p.cast()
    }

    /// SAFETY: `p` came from `alloc(kind)` and libuv no longer refers to it.
    unsafe fn free(&self, p: *mut c_void, kind: c_int) {
        // SAFETY: the caller's promise.
        unsafe { std::alloc::dealloc(p.cast(), self.layout(kind)) }
    }
}

/// The lane's socket, unless it closed with its poll handle (nothing reads or writes a shut lane).
fn connected(stream: &Option<LaneStream>) -> io::Result<&LaneStream> {
    stream
        .as_ref()
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
}

/// Reads from the socket into `buf`'s spare capacity (not zeroed first), extending it.
#[cfg(unix)]
fn read_into_spare(stream: &LaneStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    // SAFETY: `spare` is writable memory of `spare.len()` bytes owned by `buf`; recv writes at
    // most that many and says how many it wrote, and only those become part of `buf`.
    unsafe {
        let n = libc::recv(raw_fd(stream), spare.as_mut_ptr().cast(), spare.len(), 0);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        buf.set_len(buf.len() + n);
        Ok(n)
    }
}

#[cfg(not(unix))]
fn read_into_spare(_stream: &LaneStream, _buf: &mut Vec<u8>) -> io::Result<usize> {
    unreachable!("no lane without libuv's Unix poll")
}

#[cfg(unix)]
fn raw_fd(stream: &LaneStream) -> c_int {
    std::os::fd::AsRawFd::as_raw_fd(stream)
}

#[cfg(not(unix))]
fn raw_fd(_stream: &LaneStream) -> c_int {
    unreachable!("no lane without libuv's Unix poll")
}

#[cfg(unix)]
fn uv() -> Option<&'static Uv> {
    static UV: std::sync::OnceLock<Option<Uv>> = std::sync::OnceLock::new();
    UV.get_or_init(|| {
        // For side-by-side measurements (`STAMPEDE_CACHE_NO_LANE=1 node bench/redis-read.js`).
        if std::env::var_os("STAMPEDE_CACHE_NO_LANE").is_some_and(|v| v == "1") {
            return None;
        }
        fn find(name: &std::ffi::CStr) -> Option<*mut c_void> {
            // SAFETY: dlsym with RTLD_DEFAULT searches the process's global symbols.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        }
        // SAFETY: each symbol is libuv's function of that name, whose C signature the field's
        // type spells (uv.h).
        unsafe {
            macro_rules! sym {
                ($name:literal, $t:ty) => {
                    std::mem::transmute::<*mut c_void, $t>(find($name)?)
                };
            }
            Some(Uv {
                handle_size: sym!(c"uv_handle_size", HandleSizeFn),
                poll_init: sym!(c"uv_poll_init", PollInitFn),
                poll_start: sym!(c"uv_poll_start", PollStartFn),
                timer_init: sym!(c"uv_timer_init", TimerInitFn),
                timer_start: sym!(c"uv_timer_start", TimerStartFn),
                close: sym!(c"uv_close", CloseFn),
                ref_: sym!(c"uv_ref", HandleFn),
                unref: sym!(c"uv_unref", HandleFn),
                set_data: sym!(c"uv_handle_set_data", SetDataFn),
                get_data: sym!(c"uv_handle_get_data", GetDataFn),
            })
        }
    })
    .as_ref()
}

#[cfg(not(unix))]
fn uv() -> Option<&'static Uv> {
    None
}

// ---- the socket lane: a socket of the runtime's own, driven by lib/lane.js ----

/// A socket lane's connection: the object `lib/lane.js` made for it.
struct SocketIo {
    /// This lane's number, which `lib/lane.js` gives back with every chunk.
    id: u32,
    /// Its `write(bytes)` and `end()` functions, held while the lane is open.
    write: sys::napi_ref,
    end: sys::napi_ref,
    /// The handshake's replies still awaited, oldest first: whether each one's refusal refuses
    /// the lane. Empty: open.
    handshake: VecDeque<bool>,
}

impl SocketIo {
    /// Ends the socket (`end()`) and lets its functions go.
    ///
    /// SAFETY: on the JS thread of `env`, inside a napi call.
    unsafe fn end(self, env: sys::napi_env) {
        // SAFETY: the caller's promise; the references are this connection's, deleted once.
        unsafe {
            let _ = call_ref(env, self.end, &[]);
            sys::napi_delete_reference(env, self.write);
            sys::napi_delete_reference(env, self.end);
        }
    }
}

/// What `lib/lane.js` is asked to connect to.
struct Opening<'a> {
    id: u32,
    host: &'a str,
    port: u16,
    path: Option<&'a str>,
    /// The handshake's commands, written as soon as the socket is made.
    hello: &'a [u8],
    connect_ms: f64,
    command_ms: f64,
}

/// The facade's function that opens a socket lane (`setLaneOpener`), held for the life of this
/// JS thread's environment.
#[derive(Clone, Copy)]
struct Opener(sys::napi_ref);

thread_local! {
    /// How socket lanes write the reads that a chunk's answers' continuations send. Those run
    /// after `lane_data` returns, in the microtasks that follow, where the libuv lane's callback
    /// scope batches them (`BATCH`). A chunk that answered several reads begins a hold: each
    /// socket lane (a Cluster's continuations read on other nodes' lanes too) writes its first
    /// read at once (a sequential reader waits for nothing) and the rest together, with one
    /// mark, when `lib/lane.js` calls `lane_release` after those microtasks, instead of a write
    /// and a mark each. `Some`: the lanes that wrote their first read in the hold.
    static HOLDING: RefCell<Option<Vec<Rc<RefCell<Lane>>>>> = const { RefCell::new(None) };
    /// Set while a collected cache's lanes close (see `closing_in_finalizer`).
    static FINALIZING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Socket lanes shut in a finalizer, whose sockets are ended at the next lane call.
    static UNENDED: RefCell<Vec<SocketIo>> = const { RefCell::new(Vec::new()) };
    static SOCKET_OPENER: std::cell::Cell<Option<Opener>> = const { std::cell::Cell::new(None) };
    /// This thread's socket lanes by number (a lane dropped without shutting is gone here too:
    /// its chunks are then refused and its socket ended).
    static SOCKET_LANES: RefCell<std::collections::HashMap<u32, Weak<RefCell<Lane>>>> =
        RefCell::new(std::collections::HashMap::new());
    static NEXT_SOCKET_LANE: std::cell::Cell<u32> = const { std::cell::Cell::new(1) };
}

/// Whether reads take the socket lane only: on a host whose `uv_*` are not libuv's (Bun, Deno:
/// `refuseReadLane`), or when `STAMPEDE_CACHE_LANE=socket` asks for it (to run the socket lane
/// under Node, as the tests do).
fn socket_lane_only() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    NOT_LIBUV.load(std::sync::atomic::Ordering::Relaxed)
        || *FORCED
            .get_or_init(|| std::env::var_os("STAMPEDE_CACHE_LANE").is_some_and(|v| v == "socket"))
}

/// Whether this thread can open a socket lane: the facade registered its opener, and
/// `STAMPEDE_CACHE_NO_LANE=1` does not turn lanes off.
fn socket_opener_registered() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*OFF.get_or_init(|| std::env::var_os("STAMPEDE_CACHE_NO_LANE").is_some_and(|v| v == "1"))
        && SOCKET_OPENER.get().is_some()
}

/// Registers the facade's socket lane opener (`lib/lane.js`); called once as the facade loads,
/// on each JS thread that loads it.
#[napi_derive::napi]
pub fn set_lane_opener(env: Env, opener: Unknown<'_>) -> napi::Result<()> {
    if opener.get_type()? != ValueType::Function {
        return Err(napi::Error::from_reason(
            "the lane opener must be a function",
        ));
    }
    let mut r = ptr::null_mut();
    // SAFETY: on the JS thread, inside this napi call; `opener` is a live value of `env`. The
    // reference keeps the function alive as long as the thread's environment.
    napi::check_status!(unsafe { sys::napi_create_reference(env.raw(), opener.raw(), 1, &mut r) })?;
    if let Some(Opener(old)) = SOCKET_OPENER.replace(Some(Opener(r))) {
        // SAFETY: a reference made on this thread's environment, no longer held.
        unsafe { sys::napi_delete_reference(env.raw(), old) };
    }
    Ok(())
}

/// Runs `close` (which closes lanes) in a finalizer, where no JS may run: the sockets of the
/// socket lanes it shuts are ended later, inside a napi call (`end_unended`).
pub fn closing_in_finalizer(close: impl FnOnce()) {
    let was = FINALIZING.replace(true);
    close();
    FINALIZING.set(was);
}

/// Ends the sockets of socket lanes shut in a finalizer. Inside a napi call on `env`.
fn end_unended(env: sys::napi_env) {
    if UNENDED.with_borrow(Vec::is_empty) {
        return;
    }
    for socket in UNENDED.with_borrow_mut(std::mem::take) {
        // SAFETY: the caller's promise (a napi call on this thread's environment); each was
        // taken from its shut lane once.
        unsafe { socket.end(env) };
    }
}

fn socket_lane(id: u32) -> Option<Rc<RefCell<Lane>>> {
    SOCKET_LANES.with_borrow(|lanes| lanes.get(&id).and_then(Weak::upgrade))
}

/// `lib/lane.js`: a chunk socket lane `id` read (the first `length` bytes of `buffer`). Answers, once open, twice the reads in flight
/// on it (the socket is let go at 0), plus 1 if it answered several (then call `lane_release`
/// after the microtasks that follow); -1 while its handshake runs, -2 if the lane is gone or
/// shut (the socket is then ended). The reads it answered are settled inside this call.
#[napi_derive::napi]
pub fn lane_data(id: u32, buffer: &[u8], length: u32) -> i32 {
    // The lane's read buffer and how much of it this chunk filled (no view made per chunk).
    let chunk = &buffer[..(length as usize).min(buffer.len())];
    let Some(lane) = socket_lane(id) else {
        return -2;
    };
    let (answered, failure) = {
        let mut l = lane.borrow_mut();
        if l.shut {
            return -2;
        }
        l.feed(chunk)
    };
    // One answer (a sequential reader): its continuation's read is written at once, and
    // there is nothing to release.
    let answers = answered.len() > 1;
    if answers {
        HOLDING.with_borrow_mut(|holding| {
            holding.get_or_insert_with(Vec::new);
        });
    }
    if !answered.is_empty() {
        let (env, tier) = {
            let l = lane.borrow();
            (l.env, l.tier.clone())
        };
        for (s, read) in answered {
            s.answer(env, &tier, Some(read));
        }
    }
    if let Some(why) = failure {
        Lane::shut(&lane, Some(Failure::Lost(why)));
    }
    let l = lane.borrow();
    match &l.socket {
        _ if l.shut => -2,
        Some(s) if !s.handshake.is_empty() => -1,
        _ => (l.sent.len().min(i32::MAX as usize >> 1) as i32) << 1 | i32::from(answers),
    }
}

/// `lib/lane.js`: the microtasks after a chunk that answered several reads have run: the hold
/// ends, and the reads held on each socket lane (see `HOLDING`) are written together, with one
/// mark each.
#[napi_derive::napi]
pub fn lane_release() {
    let held = HOLDING.with_borrow_mut(Option::take).unwrap_or_default();
    for lane in held {
        let flushed = {
            let mut l = lane.borrow_mut();
            if l.shut {
                continue;
            }
            l.flush()
        };
        if let Err(e) = flushed {
            Lane::shut(
                &lane,
                Some(Failure::Lost(format!("Redis read lane failed: {e}"))),
            );
        }
    }
}

/// `lib/lane.js`: socket lane `id`'s timer fired (and the chunks the socket had meanwhile were
/// fed first: a busy thread is not a Redis failure). Answers the milliseconds until the oldest
/// read in flight times out (arm again), or -1 when none is in flight; a read past the command
/// timeout shuts the lane, as on the libuv lane.
#[napi_derive::napi]
pub fn lane_timer(id: u32) -> i32 {
    let Some(lane) = socket_lane(id) else {
        return -1;
    };
    {
        let l = lane.borrow();
        if l.shut {
            return -1;
        }
        let Some(first) = l.sent.front() else {
            return -1;
        };
        let now = Instant::now();
        if now < first.deadline {
            return (first.deadline - now).as_millis().min(i32::MAX as u128) as i32;
        }
    }
    let timeout = lane.borrow().tier.lane_timeout();
    Lane::shut(
        &lane,
        Some(Failure::TimedOut(format!(
            "Redis get timed out after {timeout:?} (read lane)"
        ))),
    );
    -1
}

/// `lib/lane.js`: socket lane `id`'s socket closed or failed (`why`): the reads it carried are
/// asked again on the command connection.
#[napi_derive::napi]
pub fn lane_closed(id: u32, why: String) {
    if let Some(lane) = socket_lane(id) {
        Lane::shut(&lane, Some(Failure::Lost(why)));
    }
    SOCKET_LANES.with_borrow_mut(|lanes| lanes.remove(&id));
}

/// Calls the opener with `o`: the connection's `write` and `end` functions.
///
/// SAFETY: on the JS thread of `env`, inside a napi call (a handle scope is open).
unsafe fn call_opener(
    env: sys::napi_env,
    o: Opening<'_>,
) -> napi::Result<(sys::napi_ref, sys::napi_ref)> {
    let Some(Opener(opener)) = SOCKET_OPENER.get() else {
        return Err(napi::Error::from_reason("no lane opener is registered"));
    };
    // SAFETY: the caller's promise; every value is made in the open scope and passed at once.
    unsafe {
        let mut args = [ptr::null_mut(); 7];
        napi::check_status!(sys::napi_create_uint32(env, o.id, &mut args[0]))?;
        args[1] = js_string(env, o.host)?;
        napi::check_status!(sys::napi_create_uint32(
            env,
            u32::from(o.port),
            &mut args[2]
        ))?;
        args[3] = match o.path {
            Some(p) => js_string(env, p)?,
            None => {
                let mut null = ptr::null_mut();
                napi::check_status!(sys::napi_get_null(env, &mut null))?;
                null
            }
        };
        args[4] = js_buffer(env, o.hello)?;
        napi::check_status!(sys::napi_create_double(env, o.connect_ms, &mut args[5]))?;
        napi::check_status!(sys::napi_create_double(env, o.command_ms, &mut args[6]))?;
        let conn = call_ref(env, opener, &args)?;
        let mut refs = [ptr::null_mut(); 2];
        for (r, name) in refs.iter_mut().zip([c"write", c"end"]) {
            let mut f = ptr::null_mut();
            napi::check_status!(sys::napi_get_named_property(
                env,
                conn,
                name.as_ptr(),
                &mut f
            ))?;
            napi::check_status!(sys::napi_create_reference(env, f, 1, r))?;
        }
        Ok((refs[0], refs[1]))
    }
}

/// Calls the connection's `write` with `bytes` as a Latin-1 string (one character a byte, which
/// `socket.write(s, 'latin1')` writes back byte for byte): cheaper to make than a Buffer, and
/// written from a copy, so nothing made here is held by the socket after.
///
/// SAFETY: on the JS thread of `env`, inside a napi call.
unsafe fn call_write(env: sys::napi_env, write: sys::napi_ref, bytes: &[u8]) -> napi::Result<()> {
    let mut text = ptr::null_mut();
    // SAFETY: the caller's promise; `bytes` is readable for its length, copied by the call.
    unsafe {
        napi::check_status!(sys::napi_create_string_latin1(
            env,
            bytes.as_ptr().cast(),
            bytes.len() as isize,
            &mut text
        ))?;
        call_ref(env, write, &[text]).map(|_| ())
    }
}

/// Calls the function `f` refers to with `args`; a throw is cleared and returned as an error
/// (it must not surface in the napi call that wrote or ended the socket).
///
/// SAFETY: on the JS thread of `env`, inside a napi call; `args` are values of `env`.
unsafe fn call_ref(
    env: sys::napi_env,
    f: sys::napi_ref,
    args: &[sys::napi_value],
) -> napi::Result<sys::napi_value> {
    // SAFETY: the caller's promise; `f` is a live reference of `env`.
    unsafe {
        let mut func = ptr::null_mut();
        let mut this = ptr::null_mut();
        let mut out = ptr::null_mut();
        napi::check_status!(sys::napi_get_reference_value(env, f, &mut func))?;
        napi::check_status!(sys::napi_get_undefined(env, &mut this))?;
        let status = sys::napi_call_function(env, this, func, args.len(), args.as_ptr(), &mut out);
        if status != sys::Status::napi_ok {
            let mut pending = false;
            sys::napi_is_exception_pending(env, &mut pending);
            if pending {
                let mut thrown = ptr::null_mut();
                sys::napi_get_and_clear_last_exception(env, &mut thrown);
            }
            return Err(napi::Error::from_reason("the lane's socket threw"));
        }
        Ok(out)
    }
}

/// SAFETY: on the JS thread of `env`, in a handle scope.
unsafe fn js_string(env: sys::napi_env, s: &str) -> napi::Result<sys::napi_value> {
    let mut out = ptr::null_mut();
    // SAFETY: the caller's promise; `s` is valid UTF-8 of the length given.
    napi::check_status!(unsafe {
        sys::napi_create_string_utf8(env, s.as_ptr().cast(), s.len() as isize, &mut out)
    })?;
    Ok(out)
}

/// SAFETY: on the JS thread of `env`, in a handle scope.
unsafe fn js_buffer(env: sys::napi_env, bytes: &[u8]) -> napi::Result<sys::napi_value> {
    let mut out = ptr::null_mut();
    let mut data = ptr::null_mut();
    // SAFETY: the caller's promise; `bytes` is readable for its length, copied by the call.
    napi::check_status!(unsafe {
        sys::napi_create_buffer_copy(env, bytes.len(), bytes.as_ptr().cast(), &mut data, &mut out)
    })?;
    Ok(out)
}
