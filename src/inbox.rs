//! What other threads tell the cache: keys to drop from the in-process tier (Redis bus
//! invalidations) and whether stale in-process copies may still be trusted. Written from any
//! thread; applied by the cache on its own thread at its next call, so the hot path pays one
//! relaxed atomic load while nothing is pending.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

#[derive(Debug)]
pub struct Inbox {
    /// Set whenever `keys` or `clear_all` has something; checked on every read.
    pending: AtomicBool,
    /// Keys another process replaced or deleted.
    keys: Mutex<Vec<Box<str>>>,
    /// Drop everything (the bus reconnected and may have missed messages).
    clear_all: AtomicBool,
    /// False while invalidations may be missed (bus down, Redis up): stale in-process copies
    /// are then re-checked against Redis instead of served.
    trust_stale: AtomicBool,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            pending: AtomicBool::new(false),
            keys: Mutex::new(Vec::new()),
            clear_all: AtomicBool::new(false),
            trust_stale: AtomicBool::new(true),
        }
    }
}

/// What the cache must apply.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    pub clear_all: bool,
    pub keys: Vec<Box<str>>,
}

impl Inbox {
    pub fn invalidate(&self, key: &str) {
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(key.into());
        self.pending.store(true, Ordering::Release);
    }

    pub fn invalidate_all(&self) {
        self.clear_all.store(true, Ordering::Relaxed);
        self.pending.store(true, Ordering::Release);
    }

    #[inline]
    pub fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed)
    }

    /// Takes everything pending.
    pub fn take(&self) -> Delivery {
        self.pending.store(false, Ordering::Relaxed);
        // Acquire pairs with the writers' Release: their pushes are visible below.
        std::sync::atomic::fence(Ordering::Acquire);
        let keys = std::mem::take(&mut *self.keys.lock().unwrap_or_else(|p| p.into_inner()));
        let clear_all = self.clear_all.swap(false, Ordering::Relaxed);
        Delivery { clear_all, keys }
    }

    pub fn set_trust_stale(&self, trust: bool) {
        self.trust_stale.store(trust, Ordering::Relaxed);
    }

    #[inline]
    pub fn trusts_stale(&self) -> bool {
        self.trust_stale.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn deliveries_from_other_threads_arrive_once() {
        let inbox = Arc::new(Inbox::default());
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let inbox = inbox.clone();
                std::thread::spawn(move || {
                    for i in 0..250 {
                        inbox.invalidate(&format!("{t}:{i}"));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        assert!(inbox.has_pending());
        let d = inbox.take();
        assert_eq!(d.keys.len(), 1_000);
        assert!(!d.clear_all);
        assert!(!inbox.has_pending());
        assert_eq!(inbox.take(), Delivery::default());
        inbox.invalidate_all();
        assert!(inbox.take().clear_all);
    }
}
