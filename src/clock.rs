//! The one place that reads time. Times are epoch milliseconds as `f64` (exact for integers, and
//! the unit JavaScript's `Date.now()` uses), so envelopes compare directly with JS timestamps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

pub trait Clock {
    fn now_ms(&self) -> f64;
}

/// Wall-clock time: entries are shared with other processes through Redis, so a monotonic clock
/// local to this process would not do.
///
/// Always the precise clock. The coarse wall clock (`CLOCK_REALTIME_COARSE`, ~3 ns against ~30)
/// plus twice its resolution was used as an upper bound to prove hits fresh, but on a VM with
/// steal time it fell behind the precise clock by more than that margin (in 0.13 % of 260M
/// reads, by up to 13 ms past it, on the 2-core dev VM), which served expired entries fresh.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[inline]
    fn now_ms(&self) -> f64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            // Whole milliseconds, like Date.now(): envelopes and inspect() read naturally.
            Ok(d) => d.as_millis() as f64,
            Err(_) => 0.0,
        }
    }
}

/// A clock that moves only when a test says so.
#[derive(Debug, Default, Clone)]
pub struct ManualClock {
    // f64 bits of the current time; an atomic so clones shared with the cache see each advance.
    now_bits: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(start_ms: f64) -> Self {
        ManualClock {
            now_bits: Arc::new(AtomicU64::new(start_ms.to_bits())),
        }
    }

    pub fn advance(&self, ms: f64) {
        let now = self.now_ms() + ms;
        self.now_bits.store(now.to_bits(), Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> f64 {
        f64::from_bits(self.now_bits.load(Ordering::Relaxed))
    }
}
