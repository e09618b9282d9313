//! The one place that reads time. Times are epoch milliseconds as `f64` (exact for integers, and
//! the unit JavaScript's `Date.now()` uses), so envelopes compare directly with JS timestamps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

pub trait Clock {
    fn now_ms(&self) -> f64;

    /// A time never earlier than what `now_ms` would return, cheaper to read. The hot path uses it
    /// to prove an entry fresh without the precise clock, and reads `now_ms` only near expiry.
    #[inline]
    fn upper_bound_ms(&self) -> f64 {
        self.now_ms()
    }
}

/// Wall-clock time: entries are shared with other processes through Redis, so a monotonic clock
/// local to this process would not do.
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

    /// Linux: the coarse wall clock (no syscall, ~3 ns against ~30 ns for the precise one here)
    /// plus twice its resolution. The coarse clock is the precise one as of the last tick, so it
    /// trails by at most one tick; two leave room for a late tick.
    #[cfg(target_os = "linux")]
    #[inline]
    fn upper_bound_ms(&self) -> f64 {
        coarse::upper_bound_ms().unwrap_or_else(|| self.now_ms())
    }
}

#[cfg(target_os = "linux")]
mod coarse {
    use std::sync::OnceLock;

    /// Twice the coarse clock's resolution in ms; `None` where the clock is unavailable.
    fn margin_ms() -> Option<f64> {
        static MARGIN: OnceLock<Option<f64>> = OnceLock::new();
        *MARGIN.get_or_init(|| {
            let mut res = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `res` is a valid out-pointer for the duration of the call.
            let ok = unsafe { libc::clock_getres(libc::CLOCK_REALTIME_COARSE, &mut res) } == 0;
            let res_ms = res.tv_sec as f64 * 1e3 + res.tv_nsec as f64 / 1e6;
            // A coarse clock slower than 50 ms would rarely prove anything fresh: don't use it.
            (ok && res_ms > 0.0 && res_ms <= 50.0).then_some(2.0 * res_ms)
        })
    }

    #[inline]
    pub fn upper_bound_ms() -> Option<f64> {
        let margin = margin_ms()?;
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid out-pointer for the duration of the call.
        if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } != 0 {
            return None;
        }
        Some(ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6 + margin)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upper_bound_is_never_behind_the_precise_clock() {
        let c = SystemClock;
        for _ in 0..200_000 {
            // The precise clock first: time only moves on, so a bound read after it must cover
            // it (within float rounding of epoch ms). Read the other way round, a preemption
            // between the two reads (a loaded machine) would fail the test, not the code.
            let now = c.now_ms();
            let bound = c.upper_bound_ms();
            assert!(bound + 1e-3 >= now, "bound {bound} < now {now}");
            let after = c.now_ms();
            assert!(
                bound - after < 100.0,
                "bound {bound} is far ahead of {after}"
            );
        }
    }
}
