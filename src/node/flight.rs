//! A flight's state from its first gate to its end, kept here by flight id (`EngineState::
//! flights`) so that it never round-trips through JS: the facade holds the flight id and the
//! value, and hands the engine only what it alone has (the loader's result, the value's
//! encoded bytes). As napi-rs's `Task` keeps its state in Rust until the work is done.
//!
//! A record begins at the flight's first gate (`redisGate`, `redisGateMany`), is given what
//! each gate answered as the answer lands on the JS thread, and is taken by the flight's end
//! (`adopt` or `adoptMany`, `abandon`, `writeBack` then `finishWrite`, `redisFailed`). A lock
//! it holds is released when it drops, whatever ends it (`HeldLock`).

use crate::cache::Prepared;
use crate::envelope::Envelope;
use crate::inbox::Stamp;
use crate::store::redis::{Fence, HeldLock};

use super::codes::{PURPOSE_COLD, PURPOSE_FORCE};

pub struct Flight {
    pub key: String,
    /// What the flight is for (a `PURPOSE_*` code its first gate was asked with).
    pub purpose: u32,
    /// What its last gate answered.
    pub gated: Gated,
    /// What `writeBack` prepared, for `finishWrite` (`None` inside: nothing to cache).
    pub prepared: Option<Option<Prepared>>,
}

/// What a gate answered that the flight's end needs.
#[derive(Default)]
pub enum Gated {
    /// Not answered yet, or nothing to keep (skip, closed).
    #[default]
    Nothing,
    /// Call the loader: the ticket its write-back goes with.
    Lead(Ticket),
    /// Redis had the entry: what `adopt` keeps of it.
    Found(Found),
}

/// A lead's ticket: the lock held (if won), the fence the write-back is checked against (none:
/// Redis could not be asked, keep the result in process only), the namespace clock Redis had at
/// the gate (the result is born at it), the key's invalidation stamp before Redis was asked,
/// and a refresh's entry's tags (kept by a result given none).
pub struct Ticket {
    pub lock: Option<HeldLock>,
    pub fence: Option<Fence>,
    pub born: Option<u64>,
    pub stamp: Option<Stamp>,
    pub tags: Vec<String>,
}

/// An entry a gate found: its envelope, tags, the stamp it was read under, and its value's
/// size as it crossed to JS (bytes of JSON), for `l1.maxBytes`.
pub struct Found {
    pub envelope: Envelope,
    pub tags: Vec<String>,
    pub stamp: Option<Stamp>,
    pub size: u64,
}

impl Flight {
    pub fn new(key: String, purpose: u32) -> Self {
        Flight {
            key,
            purpose,
            gated: Gated::Nothing,
            prepared: None,
        }
    }

    /// A forceRefresh: its write-back replaces what Redis has, whatever its age.
    pub fn forced(&self) -> bool {
        self.purpose == PURPOSE_FORCE
    }

    /// A refresh or forceRefresh: a result given no tags keeps those of the entry it replaces.
    pub fn inherits(&self) -> bool {
        self.purpose != PURPOSE_COLD
    }

    /// The lead's ticket, if the last gate led.
    pub fn ticket(&mut self) -> Option<&mut Ticket> {
        match &mut self.gated {
            Gated::Lead(t) => Some(t),
            _ => None,
        }
    }
}
