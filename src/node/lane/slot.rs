//! An engine's read lane, or a Cluster engine's lanes (one per master its reads went to):
//! opening, installing and reopening them.

use super::*;

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
pub(super) const MAP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

/// The most node lanes an engine opens: far above the masters of a real cluster's reads
/// (beyond it, reads take the command connection), low enough that a slot map naming
/// thousands of nodes cannot make it open thousands of sockets.
pub(super) const MAX_NODE_LANES: usize = 64;

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
pub(super) fn ready_at(
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

/// Looks up where a socket lane connects, on the runtime (a Sentinel is asked there).
pub(super) fn resolve(slot: &mut LaneSlot, tier: &Arc<RedisTier>) {
    let result = Arc::new(Mutex::new(None));
    *slot = LaneSlot::Resolving(result.clone());
    let tier = tier.clone();
    let landing = Landing::new(result);
    napi::bindgen_prelude::spawn(async move {
        landing.land(tier.socket_lane_target().await);
    });
}

/// Opens a libuv lane on the runtime: to the tier's server, or with `node` to that Cluster node.
pub(super) fn open(slot: &mut LaneSlot, tier: &Arc<RedisTier>, node: Option<(&str, u16)>) {
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
