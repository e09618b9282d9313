//! Counters behind `stats()`. Atomics so background work on other threads (Redis) can count too;
//! `Relaxed` because each counter is independent and only ever read as a snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// Live counters, each an independent atomic.
        #[derive(Debug, Default)]
        pub struct Stats { $(pub $name: Counter,)* }

        /// A copy of every counter at one moment.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct StatsSnapshot { $(pub $name: u64,)* }

        impl Stats {
            pub fn snapshot(&self) -> StatsSnapshot {
                StatsSnapshot { $($name: self.$name.get(),)* }
            }
        }
    };
}

counters!(
    hits,
    stale_hits,
    misses,
    loads,
    coalesced,
    refreshes,
    refresh_errors,
    negative_hits,
    lock_wins,
    lock_waits,
    redis_errors,
    l2_hits,
    replay_dropped,
);

#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn incr(&self) {
        self.0.fetch_add(1, Relaxed);
    }

    #[inline]
    pub fn add(&self, n: u64) {
        if n > 0 {
            self.0.fetch_add(n, Relaxed);
        }
    }

    /// Takes back `n` counted by `incr` (a read counted as a miss that Redis then answered).
    #[inline]
    pub fn sub(&self, n: u64) {
        if n > 0 {
            self.0.fetch_sub(n, Relaxed);
        }
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}
