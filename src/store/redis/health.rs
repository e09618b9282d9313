//! Whether Redis is worth asking now, and whether stale in-process copies may be served. After
//! an I/O failure Redis is skipped at once, and one call at a time (after `PROBE_INTERVAL`)
//! starts a probe, so reads are never held up by a Redis that is gone. The tier owns the probe
//! itself (it needs a connection); this part owns the state it moves.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::inbox::Inbox;
use crate::sync::LockOrRecover;

/// After a failure, Redis is skipped this long before a background probe tries it again.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(250);

#[derive(Debug)]
enum State {
    Up,
    /// Failed; skipped until `retry_at`, then one probe (`probing`) tries it.
    Down {
        retry_at: Instant,
        probing: bool,
    },
}

/// What a call may do with Redis now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Go,
    Skip,
    /// Skip it, and start the probe (this call is the one that may).
    Probe,
}

pub struct Health {
    state: Mutex<State>,
    /// True while the bus is subscribed.
    bus_up: AtomicBool,
    /// Told whether to trust stale copies whenever either half changes.
    inbox: Arc<Inbox>,
}

impl Health {
    /// Up until proven otherwise (the first calls wait for the first connection); the bus not
    /// yet subscribed.
    pub fn new(inbox: Arc<Inbox>) -> Self {
        Health {
            state: Mutex::new(State::Up),
            bus_up: AtomicBool::new(false),
            inbox,
        }
    }

    /// Only while Redis is up may a command go to it. While it is down, the first call after
    /// `retry_at` is told to start the probe and, like every other, skips Redis.
    pub fn admit(&self) -> Admit {
        match &mut *self.state.lock_or_recover() {
            State::Up => Admit::Go,
            State::Down { retry_at, probing } => {
                if !*probing && Instant::now() >= *retry_at {
                    *probing = true;
                    Admit::Probe
                } else {
                    Admit::Skip
                }
            }
        }
    }

    /// Redis answered: up again, if it was down.
    pub fn succeeded(&self) {
        let mut state = self.state.lock_or_recover();
        if !matches!(*state, State::Up) {
            *state = State::Up;
            drop(state);
            self.update_trust();
        }
    }

    /// Redis failed: skipped for `PROBE_INTERVAL`, until the returned time, when a probe starts
    /// whether or not a call comes (see `RedisTier::probe_at`).
    pub fn went_down(&self) -> Instant {
        let retry_at = Instant::now() + PROBE_INTERVAL;
        *self.state.lock_or_recover() = State::Down {
            retry_at,
            probing: false,
        };
        self.update_trust();
        retry_at
    }

    /// The first connection failed: down, and the next call probes at once (it is counted and
    /// reported as calls find it down). Down, stale copies are trusted, as after any failure.
    pub fn first_connection_failed(&self) {
        *self.state.lock_or_recover() = State::Down {
            retry_at: Instant::now(),
            probing: false,
        };
        self.update_trust();
    }

    /// The master moved: if Redis was skipped because the old one failed, the new one is tried
    /// at the next call.
    pub fn retry_now(&self) {
        if let State::Down { retry_at, .. } = &mut *self.state.lock_or_recover() {
            *retry_at = Instant::now();
        }
    }

    pub fn redis_up(&self) -> bool {
        matches!(*self.state.lock_or_recover(), State::Up)
    }

    pub fn bus_up(&self) -> bool {
        self.bus_up.load(Ordering::Relaxed)
    }

    pub fn set_bus_up(&self, up: bool) {
        self.bus_up.store(up, Ordering::Relaxed);
        self.update_trust();
    }

    /// Stale in-process copies are served unless invalidations may be missed while Redis
    /// could be asked instead (bus down, Redis up). With Redis down they are all we have.
    fn update_trust(&self) {
        self.inbox
            .set_trust_stale(self.bus_up() || !self.redis_up());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_call_probes_after_a_failure_and_an_answer_brings_it_up() {
        let health = Health::new(Arc::new(Inbox::default()));
        assert_eq!(health.admit(), Admit::Go);
        health.went_down();
        assert!(!health.redis_up());
        health.retry_now();
        assert_eq!(health.admit(), Admit::Probe);
        assert_eq!(health.admit(), Admit::Skip, "one probe at a time");
        health.succeeded();
        assert_eq!(health.admit(), Admit::Go);
    }

    #[test]
    fn stale_copies_are_trusted_unless_the_bus_is_down_while_redis_is_up() {
        let inbox = Arc::new(Inbox::default());
        let health = Health::new(inbox.clone());
        health.set_bus_up(false);
        assert!(!inbox.trusts_stale());
        health.went_down();
        assert!(inbox.trusts_stale());
        health.succeeded();
        assert!(!inbox.trusts_stale());
        health.set_bus_up(true);
        assert!(inbox.trusts_stale());
    }

    /// The bus subscribed and was lost (Redis up: copies untrusted), then the first command
    /// connection failed: Redis is down, so the stale copies are all there is.
    #[test]
    fn a_failed_first_connection_trusts_stale_copies_like_any_failure() {
        let inbox = Arc::new(Inbox::default());
        let health = Health::new(inbox.clone());
        health.set_bus_up(true);
        health.set_bus_up(false);
        assert!(!inbox.trusts_stale());
        health.first_connection_failed();
        assert!(!health.redis_up());
        assert!(inbox.trusts_stale());
    }
}
