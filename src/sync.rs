//! The one rule for a poisoned mutex: take the data as it is.
//!
//! A mutex is poisoned when a thread panicked while holding it. Every mutex here guards data
//! that each critical section leaves whole between statements (counters, queues, maps updated
//! by one call each), and a panic in the binding or the runtime is already a bug reported
//! elsewhere; failing every later caller (a read, a close) on top of it would turn one bug into
//! a cache that no longer answers.

use std::sync::{Mutex, MutexGuard, PoisonError};

pub trait LockOrRecover<T> {
    /// The guard, poisoned or not.
    fn lock_or_recover(&self) -> MutexGuard<'_, T>;
}

impl<T> LockOrRecover<T> for Mutex<T> {
    fn lock_or_recover(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_still_hands_out_its_data() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let poisoner = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = poisoner.lock().unwrap();
            *g = 2;
            panic!("poisons the mutex");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.lock_or_recover(), 2);
    }
}
