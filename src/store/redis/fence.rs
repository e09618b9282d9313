//! The fence a load takes with it: the key's state as the load began, which `write_back.lua`
//! compares with the key's state when the result comes (a `set`, a `delete` or a takeover's
//! write since drops the result). A key's state is the generation inside its envelope (empty
//! when it holds none: then the load's lock fences it). This part owns the clock fences are read
//! by, so it alone decides when a fence is too old to trust.

use std::time::{Duration, Instant};

/// What a load's result is checked against when it is written back.
#[derive(Debug, Clone, PartialEq)]
pub struct Fence {
    /// The key's state when the load began: its envelope's generation (bytes), as the scripts
    /// read it.
    pub state: Vec<u8>,
    /// When it was read, in ms since the tier's epoch (see `Fences::now_ms`).
    pub read_at_ms: f64,
}

/// How long a fence is trusted, and how long a forced load's marker lives (`fence.lua`): a load
/// whose fence is older than this (less a margin) is not written back, since the marker it may
/// be fenced by may have expired by then. (Earlier versions' generation keys lived as long.)
pub const GENERATION_TTL: Duration = Duration::from_secs(600);
const GENERATION_MARGIN: Duration = Duration::from_secs(30);

/// The clock of one tier's fences: a fence's time is ms since the tier began, a number that
/// travels with the flight (and with JS, in older shapes of it) and back.
pub struct Fences {
    epoch: Instant,
}

impl Fences {
    pub fn new() -> Self {
        Fences {
            epoch: Instant::now(),
        }
    }

    /// The fence of a key whose state the scripts just read as `state`.
    pub fn read(&self, state: Vec<u8>) -> Fence {
        Fence {
            state,
            read_at_ms: self.now_ms(),
        }
    }

    /// Ms since the tier's epoch.
    pub fn now_ms(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1_000.0
    }

    /// Read too long ago: a generation key written since may have expired, so the result is
    /// not sent (see `GENERATION_TTL`).
    pub fn outlived(&self, fence: &Fence) -> bool {
        self.now_ms() - fence.read_at_ms >= (GENERATION_TTL - GENERATION_MARGIN).as_millis() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_outlives_its_trust_a_margin_before_generation_keys_expire() {
        let fences = Fences::new();
        let fresh = fences.read(b"g".to_vec());
        assert!(!fences.outlived(&fresh));
        let margin = (GENERATION_TTL - GENERATION_MARGIN).as_millis() as f64;
        let old = Fence {
            state: b"g".to_vec(),
            read_at_ms: fences.now_ms() - margin,
        };
        assert!(fences.outlived(&old));
        let nearly = Fence {
            state: b"g".to_vec(),
            read_at_ms: fences.now_ms() - margin + 5_000.0,
        };
        assert!(!fences.outlived(&nearly));
    }
}
