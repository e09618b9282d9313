//! The per-thread engine table: an engine per cache instance, named by a `u32` id (created and
//! closed in `lifecycle.rs`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::result::Result;
use std::sync::Arc;

use super::flight::Flight;
use super::lane::{LaneSlot, NodeLanes};
use super::{js_err, JsErr};
use crate::cache::Cache;
use crate::envelope::Envelope;
use crate::error::{Error as CoreError, ErrorCode};
use crate::store::redis::{Expected, RedisTier, Reports};

/// One cache instance: the engine, its Redis tier if configured (taken out by `close`), the
/// envelopes (and tags) `set_entry` wrote that `redis_write` sends next (same JS turn, see
/// "Boundary rules" in `mod.rs`), and the records of the flights that passed a Redis gate.
pub struct EngineState {
    pub(super) cache: Cache,
    pub(super) redis: Option<Arc<RedisTier>>,
    /// The tier's failures for `onError`, drained after close too.
    pub(super) reports: Option<Arc<Reports>>,
    pub(super) written: HashMap<String, (Envelope, Vec<String>)>,
    /// What the key's entry here was when `set_entry` or `delete_entry` replaced it, which
    /// `redis_write` (same JS turn) sends along: what a replay of the change expects in Redis.
    pub(super) expected: HashMap<String, Expected>,
    /// By flight id (see `flight.rs`).
    pub(super) flights: HashMap<u64, Flight>,
    /// The read lane to the tier's server, if any (see `lane/`).
    pub(super) lane: LaneSlot,
    /// On a Cluster, the read lane to each node its reads went to.
    pub(super) node_lanes: NodeLanes,
}

impl Drop for EngineState {
    fn drop(&mut self) {
        if TEARING_DOWN.get() {
            // The thread ends with this engine still in its table (a worker terminated under
            // Bun or Deno, which run no finalizers first): its lanes' sockets go with the
            // thread's runtime, and closing them would reach thread-local storage already torn
            // down, which aborts the process. The bus task still stops.
            if let Some(r) = &self.redis {
                r.close();
            }
            return;
        }
        // A cache collected without close() still closes its lane and stops its bus task; the
        // locks its flights hold go back as their records drop, after this.
        let (lane, node_lanes) = (&mut self.lane, &mut self.node_lanes);
        super::lane::closing_in_finalizer(|| {
            lane.close();
            node_lanes.close();
        });
        if let Some(r) = &self.redis {
            r.close();
        }
    }
}

pub(super) type Engine = Rc<RefCell<EngineState>>;

/// This thread's engines by id (see `ENGINES`). Dropped only as the thread's storage is torn
/// down, which it says first (`TEARING_DOWN`), before its engines drop.
pub(super) struct Engines(Vec<Option<Engine>>);

impl std::ops::Deref for Engines {
    type Target = Vec<Option<Engine>>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Engines {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Engines {
    fn drop(&mut self) {
        TEARING_DOWN.set(true);
    }
}

thread_local! {
    /// Engines of this thread's JS environment, by id; `None` once finalized (and the id free
    /// for the next engine: a finalized engine's facade is gone, so nothing names it any more).
    pub(super) static ENGINES: RefCell<Engines> = const { RefCell::new(Engines(Vec::new())) };
    /// Set as this thread's storage is torn down with engines left in its table. A `const`
    /// cell with nothing to drop: readable until the thread's very end.
    static TEARING_DOWN: Cell<bool> = const { Cell::new(false) };
}

pub(super) fn engine(id: u32) -> Option<Engine> {
    ENGINES.with_borrow(|v| v.get(id as usize).and_then(|e| e.clone()))
}

/// Runs `f` on engine `id`; a finalized engine behaves as closed.
pub(super) fn with_engine<R>(
    id: u32,
    f: impl FnOnce(&mut EngineState) -> Result<R, CoreError>,
) -> Result<R, JsErr> {
    let Some(e) = engine(id) else {
        return Err(js_err(CoreError::new(
            ErrorCode::Closed,
            "the cache is closed",
        )));
    };
    let mut cache = e.borrow_mut();
    f(&mut cache).map_err(js_err)
}

/// Owned by the JS facade; when it is garbage-collected the engine goes with it.
pub struct EngineToken(pub(super) u32);

impl Drop for EngineToken {
    fn drop(&mut self) {
        let id = self.0 as usize;
        // The table may already be gone while the thread shuts down.
        let _ = ENGINES.try_with(|v| {
            if let Ok(mut v) = v.try_borrow_mut() {
                if let Some(slot) = v.get_mut(id) {
                    *slot = None;
                }
            }
        });
    }
}
